#!/usr/bin/env python3
"""Checks of the rendered lazyrag chart that the Go tests (helmrender/) cannot make.

    chart_check.py MODE --helmrender BIN --chart DIR --src REPO --testdata DIR

MODE is one of
  flags       every --flag of every rendered container command/args is one the binary defines
              (ABSL_FLAG in its main.cc and the project files it includes, e.g.
              common/tls_flags.cc), and every argument is a --flag; the binaries exit 1 on an
              unknown flag ("Unknown command line flag"), which is a CrashLoopBackOff.
  schema      values.yaml and the value sets pass values.schema.json; bad-schema.yaml fails it
              on every bad key (what `helm lint` / `helm template` do with the schema; helmrender
              does not read the schema).
  kubernetes  every rendered object of every value set passes kubernetes-validate (strict: no
              unknown fields) for the oldest (Chart.yaml kubeVersion) and newest Kubernetes.

Value sets: the chart's defaults (GPU workers), testdata/values-cpu.yaml (CPU only),
values-tls.yaml (TLS), values-auth.yaml and values-auth-secret.yaml (bearer tokens and MACs,
generated or existing Secret), values-auth-certificate.yaml (workers known by their certificate),
values-ipv6.yaml (IPv6), values-multi.yaml (production-shaped), values-monitoring.yaml
(PrometheusRule, dashboard ConfigMap, helm test pod, pass-through pod values),
values-autoscaling.yaml (router HPA, worker KEDA ScaledObject). PrometheusRule,
ServiceMonitor and ScaledObject are CRDs: kubernetes mode skips them (the Go tests
TestMonitoringObjects and TestAutoscaling check their structure). Each mode
also runs on deliberately bad input and fails if the bad input passes.
Exit status: 0 pass, 1 fail, 77 skip (a Python module is missing).
"""

import argparse
import json
import os
import re
import subprocess
import sys

SKIP = 77

try:
    import yaml
except ImportError:
    print("SKIP: python3 has no PyYAML (Debian package python3-yaml)")
    sys.exit(SKIP)

VALUE_SETS = {
    "gpu-default": [],
    "cpu": ["values-cpu.yaml"],
    "tls": ["values-tls.yaml"],
    "ipv6": ["values-ipv6.yaml"],
    "multi": ["values-multi.yaml"],
    "monitoring": ["values-monitoring.yaml"],
    "autoscaling": ["values-autoscaling.yaml"],
    "auth": ["values-auth.yaml"],
    "auth-secret": ["values-auth-secret.yaml"],
    "auth-certificate": ["values-auth-certificate.yaml"],
}
COMPONENTS = ("kvstore", "worker", "router")  # container name == binary folder


def render(args, files):
    cmd = [args.helmrender, "--namespace", "rag"]
    for f in files:
        cmd += ["-f", f]
    cmd.append(args.chart)
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("helmrender %s: %s" % (" ".join(files), out.stderr.strip()))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def value_set_files(args, name):
    return [os.path.join(args.testdata, f) for f in VALUE_SETS[name]]


# --- flags ---------------------------------------------------------------------------------
FLAG_DEF = re.compile(r"ABSL_FLAG\(\s*([\w:<>]+)\s*,\s*(\w+)\s*,", re.S)
INCLUDE = re.compile(r'^#include "([^"]+)"', re.M)


def accepted_flags(src, component):
    """{name: type} of the ABSL_FLAGs of COMPONENT/main.cc and the project files it includes
    (transitively; a header's sibling .cc counts, since it is what defines the flag)."""
    flags, seen = {}, set()
    todo = [os.path.join(component, "main.cc")]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        path = os.path.join(src, rel)
        if not os.path.isfile(path):
            continue  # a system or third-party header
        text = open(path, encoding="utf-8").read()
        for kind, name in FLAG_DEF.findall(text):
            flags[name] = kind
        for inc in INCLUDE.findall(text):
            todo.append(inc)
            if inc.endswith(".h"):
                todo.append(inc[:-2] + ".cc")
    return flags


HEALTH_FLAGS = re.compile(r"kHealthFlags\[\]\s*=\s*\{([^}]*)\}", re.S)


def health_flags(src):
    """The flags of `lazyrag-cli health` (the kHealthFlags table of cli/health_command.cc)."""
    text = open(os.path.join(src, "cli", "health_command.cc"), encoding="utf-8").read()
    m = HEALTH_FLAGS.search(text)
    return {name: "string" for name in re.findall(r'"(\w+)"', m.group(1))} if m else {}


def probe_errors(where, c, flags_by_binary):
    """Messages for exec probes that run lazyrag-cli with a command or flag it does not take."""
    errors = []
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        cmd = [str(a) for a in ((c.get(probe) or {}).get("exec") or {}).get("command") or []]
        if not cmd or not cmd[0].endswith("/lazyrag-cli"):
            continue
        if len(cmd) < 2 or cmd[1] != "health":
            errors.append("%s %s: lazyrag-cli without the health command: %s" % (where, probe, cmd))
            continue
        accepted = flags_by_binary.get("cli health", {})
        for arg in cmd[2:]:
            m = re.fullmatch(r"--([A-Za-z0-9_]+)=.*", arg, re.S)
            if not m or m.group(1) not in accepted:
                errors.append("%s %s: %s is not a flag of lazyrag-cli health (it takes: %s)" %
                              (where, probe, arg, " ".join(sorted(accepted))))
    return errors


def flag_errors(docs, flags_by_binary):
    """Messages for every container argument that is not an accepted --flag, and every probe
    command of lazyrag-cli health with a flag it does not take."""
    errors = []
    for doc in docs:
        spec = (((doc.get("spec") or {}).get("template") or {}).get("spec")) or {}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            binary = c.get("name")
            where = "%s/%s container %s" % (doc["kind"], doc["metadata"]["name"], binary)
            errors += probe_errors(where, c, flags_by_binary)
            if binary not in flags_by_binary:
                errors.append("%s: no binary of that name to check its flags against" % where)
                continue
            accepted = flags_by_binary[binary]
            for arg in (c.get("command") or []) + (c.get("args") or []):
                arg = str(arg)
                m = re.fullmatch(r"--?([A-Za-z0-9_]+)(=.*)?", arg, re.S)
                if not m:
                    errors.append("%s: argument %r is not a --flag (a positional argument, or "
                                  "a flag split from its value: write --flag=value)" % (where, arg))
                    continue
                name = m.group(1)
                bool_negation = (name.startswith("no") and accepted.get(name[2:]) == "bool"
                                 and m.group(2) is None)
                if name not in accepted and not bool_negation:
                    errors.append("%s: %s is not a flag of lazyrag-%s (it defines: %s)" %
                                  (where, arg, binary, " ".join(sorted(accepted))))
    return errors


def check_flags(args):
    flags_by_binary = {c: accepted_flags(args.src, c) for c in COMPONENTS}
    failures = 0
    for c, flags in flags_by_binary.items():
        for required in ("listen", "metrics_port", "metrics_host", "tls_cert"):
            if required not in flags:
                print("FAIL: parsed no --%s for lazyrag-%s; the ABSL_FLAG parser is broken" %
                      (required, c))
                failures += 1
    flags_by_binary["cli health"] = health_flags(args.src)
    if not {"target", "tls_ca", "tls_cert", "tls_key"} <= set(flags_by_binary["cli health"]):
        print("FAIL: parsed no kHealthFlags of cli/health_command.cc; the parser is broken")
        failures += 1
    for name in VALUE_SETS:
        errors = flag_errors(render(args, value_set_files(args, name)), flags_by_binary)
        for e in errors:
            print("FAIL [%s] %s" % (name, e))
        failures += len(errors)
        if not errors:
            print("ok   [%s] every container argument is an accepted flag" % name)
    # The check itself: bad-flags.yaml must give exactly these three errors.
    bad = flag_errors(render(args, [os.path.join(args.testdata, "bad-flags.yaml")]),
                      flags_by_binary)
    for needle in ("--v=1 is not a flag of lazyrag-kvstore", "'32' is not a --flag",
                   "--nosuchflag is not a flag of lazyrag-router"):
        if not any(needle in e for e in bad):
            print("FAIL: bad-flags.yaml was not rejected with %r; got %s" % (needle, bad))
            failures += 1
    # A TLS probe with a flag lazyrag-cli health does not take must be rejected too.
    probe = {"kind": "Deployment", "metadata": {"name": "x"}, "spec": {"template": {"spec": {
        "containers": [{"name": "router", "readinessProbe": {"exec": {"command": [
            "/usr/local/bin/lazyrag-cli", "health", "--target=localhost:1", "--tls_nosuch=1"]}}}]}}}}
    if not any("--tls_nosuch=1 is not a flag of lazyrag-cli health" in e
               for e in flag_errors([probe], flags_by_binary)):
        print("FAIL: a probe running lazyrag-cli health --tls_nosuch was not rejected")
        failures += 1
    else:
        print("ok   [bad-probe] lazyrag-cli health --tls_nosuch rejected")
    if len(bad) == 3:
        print("ok   [bad-flags] rejected: %s" % "; ".join(e.split(": ", 1)[1][:60] for e in bad))
    else:
        print("FAIL: bad-flags.yaml gave %d errors, want 3: %s" % (len(bad), bad))
        failures += 1
    return failures


# --- schema --------------------------------------------------------------------------------
def merge(base, override):
    """helm -f: maps merge key by key, anything else replaces, null deletes."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            out.pop(k, None)
        elif isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = v
    return out


def merged_values(args, files):
    values = yaml.safe_load(open(os.path.join(args.chart, "values.yaml")))
    for f in files:
        values = merge(values, yaml.safe_load(open(f)) or {})
    return values


def check_schema(args):
    try:
        import jsonschema
    except ImportError:
        print("SKIP: python3 has no jsonschema (pip install kubernetes-validate brings it)")
        return None
    schema = json.load(open(os.path.join(args.chart, "values.schema.json")))
    validator = jsonschema.Draft7Validator(schema)
    failures = 0
    for name in VALUE_SETS:
        errors = list(validator.iter_errors(merged_values(args, value_set_files(args, name))))
        for e in errors:
            print("FAIL [%s] %s: %s" % (name, "/".join(map(str, e.absolute_path)), e.message))
        failures += len(errors)
        if not errors:
            print("ok   [%s] values pass values.schema.json" % name)
    bad = merged_values(args, [os.path.join(args.testdata, "bad-schema.yaml")])
    got = {"/".join(map(str, e.absolute_path)) or "(root)": e.message
           for e in validator.iter_errors(bad)}
    want = ["kvstore/shards", "kvstore/grpcPort", "worker/device", "worker/gpus", "worker/pageSize",
            "worker/extraArgs/0", "router/service/type", "router", "kvstore/priorityClassName",
            "worker/extraVolumeMounts/0", "monitoring/grafanaDashboard"]  # router: replicaz unknown
    for path in want:
        if path not in got:
            print("FAIL: bad-schema.yaml: no schema error at %s; errors: %s" % (path, got))
            failures += 1
        else:
            print("ok   [bad-schema] %s rejected: %s" % (path, got[path][:80]))
    return failures


# --- kubernetes ----------------------------------------------------------------------------
def check_kubernetes(args):
    try:
        import kubernetes_validate
    except ImportError:
        print("SKIP: python3 has no kubernetes_validate (pip install kubernetes-validate; "
              "deploy/local/bootstrap.sh installs it)")
        return None
    chart = yaml.safe_load(open(os.path.join(args.chart, "Chart.yaml")))
    oldest = re.search(r"(\d+\.\d+)", chart["kubeVersion"]).group(1)
    versions = [oldest, kubernetes_validate.latest_version()]
    failures = 0
    for name in VALUE_SETS:
        docs = render(args, value_set_files(args, name))
        checked, skipped = 0, []
        for doc in docs:
            what = "%s/%s" % (doc["kind"], doc["metadata"]["name"])
            if doc["apiVersion"].startswith(("monitoring.coreos.com/", "keda.sh/")):
                skipped.append(what)  # a CRD (Prometheus Operator, KEDA): no schema in the package
                continue
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    print("FAIL [%s] %s (Kubernetes %s): %s at %s" %
                          (name, what, version, e.message, "/".join(map(str, e.path))))
                    failures += 1
                except kubernetes_validate.SchemaNotFoundError:
                    print("FAIL [%s] %s: no Kubernetes %s schema for %s %s" %
                          (name, what, version, doc["apiVersion"], doc["kind"]))
                    failures += 1
            checked += 1
        print("ok   [%s] %d objects checked against Kubernetes %s%s" %
              (name, checked, " and ".join(versions),
               "; not checked (CRD): " + ", ".join(skipped) if skipped else ""))
    # The check itself: an object with an unknown field and a wrong type must fail.
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": "grpc"}], "clusterIp": "None"}}
    try:
        kubernetes_validate.validate(bad, versions[0], strict=True)
        print("FAIL: kubernetes-validate accepted a Service with a bad port and an unknown field")
        failures += 1
    except kubernetes_validate.ValidationError as e:
        print("ok   [bad-object] rejected: %s" % e.message[:80])
    return failures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=["flags", "schema", "kubernetes"])
    p.add_argument("--helmrender", required=True)
    p.add_argument("--chart", required=True)
    p.add_argument("--src", required=True, help="repository root (for */main.cc)")
    p.add_argument("--testdata", required=True)
    args = p.parse_args()
    failures = {"flags": check_flags, "schema": check_schema,
                "kubernetes": check_kubernetes}[args.mode](args)
    if failures is None:
        return SKIP
    print("%s: %d failure(s)" % (args.mode, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
