// Tests of the lazyrag Helm chart (deploy/helm/lazyrag).
//
// Helm itself is not available here (it is not in the Debian or PyPI registries this project
// installs from), so these tests render the chart with helmrender: Go's text/template plus
// sprig (Debian's golang-github-masterminds-sprig-dev, the function library Helm uses) and the
// Helm functions the chart calls (include, required, toYaml, fromYaml), with Helm's value
// semantics (numbers are float64). What that does not cover: Helm's own template engine
// quirks beyond these, subcharts, hooks, schema validation, and the API server's validation of
// the manifests (no cluster here). The checks below parse every manifest as YAML and look for
// the kinds and fields DESIGN.md section 3 and issue 8 need.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	yaml "gopkg.in/yaml.v3"
)

var (
	chartDir    = flag.String("chart", "../../../deploy/helm/lazyrag", "chart folder")
	testdataDir = flag.String("testdata", "../testdata", "folder with values-multi.yaml")
)

type obj = map[string]interface{}

// get walks maps by key and lists by integer index; nil when a step is missing.
func get(v interface{}, path ...interface{}) interface{} {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(obj)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]interface{})
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func str(v interface{}) string {
	if v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func num(t *testing.T, v interface{}) int64 {
	t.Helper()
	switch n := v.(type) {
	case int:
		return int64(n)
	case int64:
		return n
	case float64:
		return int64(n)
	case string:
		i, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("%q is not an integer", n)
		}
		return i
	}
	t.Fatalf("%v (%T) is not a number", v, v)
	return 0
}

type rendered struct {
	values obj
	docs   []obj
	byKey  map[string]obj // "Kind/name"
}

func render(t *testing.T, release string, valuesFiles ...string) *rendered {
	t.Helper()
	res, err := Render(Options{ChartDir: *chartDir, ValuesFiles: valuesFiles, ReleaseName: release, Namespace: "rag"})
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := &rendered{values: res.Values, byKey: map[string]obj{}}
	for _, m := range res.Manifests {
		dec := yaml.NewDecoder(strings.NewReader(m.Content))
		for {
			var doc obj
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s does not parse as YAML: %v\n%s", m.Source, err, m.Content)
			}
			if doc == nil {
				continue
			}
			kind, name := str(doc["kind"]), str(get(doc, "metadata", "name"))
			if str(doc["apiVersion"]) == "" || kind == "" || name == "" {
				t.Errorf("%s: a manifest without apiVersion, kind or metadata.name", m.Source)
			}
			key := kind + "/" + name
			if _, dup := r.byKey[key]; dup {
				t.Errorf("%s rendered twice", key)
			}
			r.byKey[key] = doc
			r.docs = append(r.docs, doc)
		}
	}
	if res.Notes == "" {
		t.Errorf("NOTES.txt rendered empty")
	}
	return r
}

func (r *rendered) value(path ...interface{}) interface{} { return get(r.values, path...) }

// autoscaled: an HPA or a KEDA ScaledObject owns the component's replica count.
func (r *rendered) autoscaled(component string) bool {
	return r.value(component, "autoscaling", "enabled") == true || r.value(component, "keda", "enabled") == true
}

// workload finds the StatefulSet or Deployment of a component.
func (r *rendered) workload(t *testing.T, kind, component string) obj {
	t.Helper()
	for _, d := range r.docs {
		if str(d["kind"]) == kind && str(get(d, "metadata", "labels", "app.kubernetes.io/component")) == component {
			return d
		}
	}
	t.Fatalf("no %s for component %s", kind, component)
	return nil
}

func (r *rendered) ofKind(kind string) []obj {
	var out []obj
	for _, d := range r.docs {
		if str(d["kind"]) == kind {
			out = append(out, d)
		}
	}
	return out
}

// selects: every label of the selector is on the pod with the same value.
func selects(selector, podLabels interface{}) bool {
	sel, ok := selector.(obj)
	if !ok || len(sel) == 0 {
		return false
	}
	pl, _ := podLabels.(obj)
	for k, v := range sel {
		if str(pl[k]) != str(v) {
			return false
		}
	}
	return true
}

func args(w obj) map[string]string {
	out := map[string]string{}
	for _, a := range get(w, "spec", "template", "spec", "containers", 0, "args").([]interface{}) {
		s := str(a)
		if k, v, ok := strings.Cut(s, "="); ok {
			out[k] = v
		} else {
			out[s] = ""
		}
	}
	return out
}

func containerPort(t *testing.T, w obj, name string) int64 {
	t.Helper()
	for _, p := range get(w, "spec", "template", "spec", "containers", 0, "ports").([]interface{}) {
		if str(get(p, "name")) == name {
			return num(t, get(p, "containerPort"))
		}
	}
	t.Fatalf("%s has no container port %q", get(w, "metadata", "name"), name)
	return 0
}

// headlessServiceOf returns the headless Service named by a StatefulSet's serviceName and
// checks that it selects the StatefulSet's pods.
func (r *rendered) headlessServiceOf(t *testing.T, sts obj) obj {
	t.Helper()
	name := str(get(sts, "spec", "serviceName"))
	svc := r.byKey["Service/"+name]
	if svc == nil {
		t.Fatalf("StatefulSet %s: its serviceName %q is not a rendered Service", get(sts, "metadata", "name"), name)
	}
	if str(get(svc, "spec", "clusterIP")) != "None" {
		t.Errorf("Service %s must be headless (clusterIP: None)", name)
	}
	if get(svc, "spec", "publishNotReadyAddresses") != true {
		t.Errorf("Service %s must publish not-ready addresses (stable membership)", name)
	}
	if !selects(get(svc, "spec", "selector"), get(sts, "spec", "template", "metadata", "labels")) {
		t.Errorf("Service %s does not select the pods of its StatefulSet", name)
	}
	return svc
}

// addressList checks a comma-separated --kvstore/--workers list: n addresses
// STS-I.SERVICE.rag.svc.DOMAIN:PORT for I = 0..n-1.
func addressList(t *testing.T, flagName, list string, sts, svc obj, n, port int64, domain string) {
	t.Helper()
	addrs := strings.Split(list, ",")
	if int64(len(addrs)) != n {
		t.Fatalf("%s lists %d addresses, want %d: %s", flagName, len(addrs), n, list)
	}
	for i, a := range addrs {
		want := fmt.Sprintf("%s-%d.%s.rag.svc.%s:%d", get(sts, "metadata", "name"), i, get(svc, "metadata", "name"), domain, port)
		if a != want {
			t.Errorf("%s[%d] = %q, want %q", flagName, i, a, want)
		}
	}
}

// checkDesign checks what every values file must give: the kinds and fields the design needs,
// with the numbers taken from the merged values.
func checkDesign(t *testing.T, r *rendered) {
	tlsOn := r.value("tls", "enabled") == true
	domain := str(r.value("clusterDomain"))

	// kvstore: StatefulSet with one PVC per shard and a headless Service.
	kv := r.workload(t, "StatefulSet", "kvstore")
	if got, want := num(t, get(kv, "spec", "replicas")), num(t, r.value("kvstore", "shards")); got != want {
		t.Errorf("kvstore replicas %d, want kvstore.shards %d", got, want)
	}
	kvSvc := r.headlessServiceOf(t, kv)
	claim := get(kv, "spec", "volumeClaimTemplates", 0)
	if claim == nil {
		t.Fatalf("kvstore StatefulSet has no volumeClaimTemplates")
	}
	if got, want := str(get(claim, "spec", "resources", "requests", "storage")), str(r.value("kvstore", "persistence", "size")); got != want {
		t.Errorf("kvstore claim size %q, want %q", got, want)
	}
	if !reflect.DeepEqual(get(claim, "spec", "accessModes"), r.value("kvstore", "persistence", "accessModes")) {
		t.Errorf("kvstore claim accessModes %v", get(claim, "spec", "accessModes"))
	}
	if sc := str(r.value("kvstore", "persistence", "storageClass")); sc != str(get(claim, "spec", "storageClassName")) {
		t.Errorf("kvstore storageClassName %v, want %q", get(claim, "spec", "storageClassName"), sc)
	}
	mount := str(r.value("kvstore", "persistence", "mountPath"))
	foundMount := false
	for _, m := range get(kv, "spec", "template", "spec", "containers", 0, "volumeMounts").([]interface{}) {
		if str(get(m, "name")) == str(get(claim, "metadata", "name")) && str(get(m, "mountPath")) == mount {
			foundMount = true
		}
	}
	if !foundMount {
		t.Errorf("kvstore container does not mount its claim at %s", mount)
	}
	kvArgs := args(kv)
	if kvArgs["--data_dir"] != mount {
		t.Errorf("kvstore --data_dir=%q, want %q", kvArgs["--data_dir"], mount)
	}
	if got, want := kvArgs["--capacity_bytes"], fmt.Sprint(num(t, r.value("kvstore", "capacityBytes"))); got != want {
		t.Errorf("kvstore --capacity_bytes=%q, want %q", got, want)
	}
	kvGrpc := containerPort(t, kv, "grpc")
	if kvGrpc != num(t, r.value("kvstore", "grpcPort")) || containerPort(t, kv, "metrics") != num(t, r.value("kvstore", "metricsPort")) {
		t.Errorf("kvstore container ports do not follow kvstore.grpcPort / metricsPort")
	}

	// worker: GPU pods, model source, pool and page size, shards found through the headless
	// Service, replication factor.
	wk := r.workload(t, "StatefulSet", "worker")
	if r.autoscaled("worker") {
		// TestAutoscaling: the autoscaler owns the replica count.
	} else if got, want := num(t, get(wk, "spec", "replicas")), num(t, r.value("worker", "replicas")); got != want {
		t.Errorf("worker replicas %d, want %d", got, want)
	}
	wkSvc := r.headlessServiceOf(t, wk)
	wkArgs := args(wk)
	addressList(t, "--kvstore", wkArgs["--kvstore"], kv, kvSvc, num(t, r.value("kvstore", "shards")), kvGrpc, domain)
	// replication 0 keeps the kvstore client's default: no flag.
	if replication := num(t, r.value("kvstore", "replication")); replication > 0 {
		if got := wkArgs["--kvstore_replication"]; got != fmt.Sprint(replication) {
			t.Errorf("worker --kvstore_replication=%q, want %d", got, replication)
		}
	} else if _, ok := wkArgs["--kvstore_replication"]; ok {
		t.Errorf("worker gets --kvstore_replication with kvstore.replication 0")
	}
	for flagName, key := range map[string]string{"--kv_pool_bytes": "kvPoolBytes", "--host_cache_bytes": "hostCacheBytes", "--page_size": "pageSize", "--max_batch_tokens": "maxBatchTokens"} {
		if got, want := wkArgs[flagName], fmt.Sprint(num(t, r.value("worker", key))); got != want {
			t.Errorf("worker %s=%q, want %q", flagName, got, want)
		}
	}
	if wkArgs["--model"] != str(r.value("worker", "model", "path")) || wkArgs["--device"] != str(r.value("worker", "device")) {
		t.Errorf("worker --model/--device do not follow worker.model.path / worker.device: %v", wkArgs)
	}
	podSpec := get(wk, "spec", "template", "spec")
	hasModelVolume := false
	for _, v := range get(podSpec, "volumes").([]interface{}) {
		if str(get(v, "name")) == "model" {
			hasModelVolume = true
			src := obj{}
			for k, x := range v.(obj) {
				if k != "name" {
					src[k] = x
				}
			}
			if !reflect.DeepEqual(jsonish(src), jsonish(r.value("worker", "model", "volume"))) {
				t.Errorf("model volume %v, want worker.model.volume %v", src, r.value("worker", "model", "volume"))
			}
		}
	}
	if wantVolume := r.value("worker", "model", "source") == "volume"; hasModelVolume != wantVolume {
		t.Errorf("model volume present=%v with worker.model.source=%v", hasModelVolume, r.value("worker", "model", "source"))
	}
	gpuName := str(r.value("worker", "gpuResourceName"))
	limits := get(podSpec, "containers", 0, "resources", "limits")
	requests := get(podSpec, "containers", 0, "resources", "requests")
	if r.value("worker", "device") == "cuda" {
		want := num(t, r.value("worker", "gpus"))
		if get(limits, gpuName) == nil || num(t, get(limits, gpuName)) != want || get(requests, gpuName) == nil || num(t, get(requests, gpuName)) != want {
			t.Errorf("worker %s limits/requests %v/%v, want %d", gpuName, get(limits, gpuName), get(requests, gpuName), want)
		}
	} else if get(limits, gpuName) != nil || get(requests, gpuName) != nil {
		t.Errorf("a cpu worker requests %s", gpuName)
	}
	// Scheduling: the worker's own nodeSelector and tolerations, plus the GPU ones only with
	// device cuda (a CPU worker must schedule on nodes without GPUs).
	wantSelector := obj{}
	var wantTolerations []interface{}
	sources := []string{""}
	if r.value("worker", "device") == "cuda" {
		sources = append(sources, "gpu")
	}
	for _, prefix := range sources {
		selKey, tolKey := "nodeSelector", "tolerations"
		if prefix != "" {
			selKey, tolKey = "gpuNodeSelector", "gpuTolerations"
		}
		if m, ok := r.value("worker", selKey).(obj); ok {
			for k, v := range m {
				wantSelector[k] = v
			}
		}
		if l, ok := r.value("worker", tolKey).([]interface{}); ok {
			wantTolerations = append(wantTolerations, l...)
		}
	}
	if !reflect.DeepEqual(jsonish(get(podSpec, "nodeSelector")), jsonish(wantSelector)) {
		t.Errorf("worker nodeSelector %v, want %v", get(podSpec, "nodeSelector"), wantSelector)
	}
	gotTolerations, _ := get(podSpec, "tolerations").([]interface{})
	if len(gotTolerations) != len(wantTolerations) || (len(wantTolerations) > 0 && !reflect.DeepEqual(jsonish(gotTolerations), jsonish(wantTolerations))) {
		t.Errorf("worker tolerations %v, want %v", gotTolerations, wantTolerations)
	}
	// Tensor parallelism over a pod's GPUs: --tp=gpus with cuda and gpus > 1, else no --tp.
	if gpus := num(t, r.value("worker", "gpus")); r.value("worker", "device") == "cuda" && gpus > 1 {
		if wkArgs["--tp"] != fmt.Sprint(gpus) {
			t.Errorf("worker with %d GPUs: --tp=%q, want %d", gpus, wkArgs["--tp"], gpus)
		}
	} else if _, ok := wkArgs["--tp"]; ok {
		t.Errorf("worker gets --tp=%s with device %v, gpus %d", wkArgs["--tp"], r.value("worker", "device"), gpus)
	}

	// router: Deployment + client Service; workers found through their headless Service.
	rt := r.workload(t, "Deployment", "router")
	if r.autoscaled("router") {
		// TestAutoscaling: the autoscaler owns the replica count.
	} else if got, want := num(t, get(rt, "spec", "replicas")), num(t, r.value("router", "replicas")); got != want {
		t.Errorf("router replicas %d, want %d", got, want)
	}
	if r.value("router", "workerDiscovery") == "static" {
		addressList(t, "--workers", args(rt)["--workers"], wk, wkSvc, num(t, r.value("worker", "replicas")), containerPort(t, wk, "grpc"), domain)
	} else if got, want := args(rt)["--workers"], fmt.Sprintf("dns:///%s.rag.svc.%s:%d", get(wkSvc, "metadata", "name"), domain, containerPort(t, wk, "grpc")); got != want {
		t.Errorf("router --workers=%q, want %q (the workers' headless Service)", got, want)
	}
	clientSvc := r.byKey["Service/"+str(get(rt, "metadata", "name"))]
	if clientSvc == nil || str(get(clientSvc, "spec", "type")) != str(r.value("router", "service", "type")) ||
		!selects(get(clientSvc, "spec", "selector"), get(rt, "spec", "template", "metadata", "labels")) {
		t.Errorf("router client Service missing, of the wrong type or not selecting the routers: %v", clientSvc)
	} else if p := get(clientSvc, "spec", "ports", 0); num(t, get(p, "port")) != num(t, r.value("router", "service", "port")) || str(get(p, "targetPort")) != "grpc" {
		t.Errorf("router Service port %v", p)
	}

	// Every workload: gRPC probes on its gRPC port (TCP with TLS), resources, metrics port,
	// scrape annotations, a PDB that selects its pods.
	pdbs := r.ofKind("PodDisruptionBudget")
	for _, w := range []obj{kv, wk, rt} {
		name := str(get(w, "metadata", "name"))
		c := get(w, "spec", "template", "spec", "containers", 0)
		grpcPort := containerPort(t, w, "grpc")
		for _, probe := range []string{"readinessProbe", "livenessProbe"} {
			p := get(c, probe)
			if tlsOn && probe == "livenessProbe" {
				// The kubelet cannot speak TLS: liveness asks the process itself (/metrics).
				if str(get(p, "httpGet", "path")) != "/metrics" || get(p, "httpGet", "port") == nil || num(t, get(p, "httpGet", "port")) != containerPort(t, w, "metrics") {
					t.Errorf("%s %s: want an httpGet of /metrics on the metrics port with TLS, got %v", name, probe, p)
				}
			} else if tlsOn {
				// Readiness: the images' TLS health client with the pod's certificate.
				cmd, _ := get(p, "exec", "command").([]interface{})
				want := []string{"/usr/local/bin/lazyrag-cli", "health", fmt.Sprintf("--target=localhost:%d", grpcPort),
					"--tls_ca=" + str(r.value("tls", "mountPath")) + "/ca.crt",
					"--tls_cert=" + str(r.value("tls", "mountPath")) + "/tls.crt",
					"--tls_key=" + str(r.value("tls", "mountPath")) + "/tls.key"}
				if len(cmd) < len(want) {
					t.Errorf("%s %s: want an exec of lazyrag-cli health with TLS, got %v", name, probe, p)
					continue
				}
				for i, w := range want {
					if str(cmd[i]) != w {
						t.Errorf("%s %s: command[%d] %q, want %q", name, probe, i, cmd[i], w)
					}
				}
				if !containsStr(cmd, "--tls_server_name="+name) {
					t.Errorf("%s %s: want --tls_server_name=%s (the component's Service), got %v", name, probe, name, cmd)
				}
			} else if get(p, "grpc", "port") == nil || num(t, get(p, "grpc", "port")) != grpcPort {
				t.Errorf("%s %s: want a grpc probe on port %d, got %v", name, probe, grpcPort, p)
			}
		}
		checkListenAddresses(t, r, w)
		checkRestricted(t, w)
		for _, part := range []string{"requests", "limits"} {
			if m, _ := get(c, "resources", part).(obj); len(m) == 0 {
				t.Errorf("%s has no resource %s", name, part)
			}
		}
		metricsPort := containerPort(t, w, "metrics")
		if args(w)["--metrics_port"] != fmt.Sprint(metricsPort) {
			t.Errorf("%s --metrics_port=%q, container port metrics %d", name, args(w)["--metrics_port"], metricsPort)
		}
		if r.value("metrics", "podAnnotations") == true {
			ann := get(w, "spec", "template", "metadata", "annotations")
			if str(get(ann, "prometheus.io/scrape")) != "true" || str(get(ann, "prometheus.io/port")) != fmt.Sprint(metricsPort) {
				t.Errorf("%s scrape annotations %v", name, ann)
			}
		}
		if tlsOn {
			a := args(w)
			if a["--tls_cert"] == "" || a["--tls_key"] == "" || a["--tls_ca"] == "" {
				t.Errorf("%s: TLS on but no --tls_cert/--tls_key/--tls_ca", name)
			}
			mounted := false
			for _, m := range get(c, "volumeMounts").([]interface{}) {
				mounted = mounted || str(get(m, "name")) == "tls"
			}
			if !mounted {
				t.Errorf("%s: TLS secret not mounted", name)
			}
		}
		covered := 0
		for _, p := range pdbs {
			if selects(get(p, "spec", "selector", "matchLabels"), get(w, "spec", "template", "metadata", "labels")) {
				covered++
			}
		}
		if covered != 1 {
			t.Errorf("%s is covered by %d PodDisruptionBudgets, want 1", name, covered)
		}
		for _, s := range []string{"spec.selector.matchLabels"} {
			if !selects(get(w, "spec", "selector", "matchLabels"), get(w, "spec", "template", "metadata", "labels")) {
				t.Errorf("%s: %s does not match its pod labels", name, s)
			}
		}
	}
	if len(pdbs) != 3 {
		t.Errorf("%d PodDisruptionBudgets, want 3", len(pdbs))
	}

	// Every Service selects some pods and targets named ports those pods have.
	for _, svc := range r.ofKind("Service") {
		var target obj
		for _, w := range []obj{kv, wk, rt} {
			if selects(get(svc, "spec", "selector"), get(w, "spec", "template", "metadata", "labels")) {
				target = w
			}
		}
		if target == nil {
			t.Errorf("Service %s selects no workload", get(svc, "metadata", "name"))
			continue
		}
		for _, p := range get(svc, "spec", "ports").([]interface{}) {
			containerPort(t, target, str(get(p, "targetPort")))
		}
	}

	// Numbers print as digits (Helm's float64 values would otherwise show 1e+10).
	scientific := regexp.MustCompile(`^[0-9.]+e[+-][0-9]+$`)
	for _, w := range []obj{kv, wk, rt} {
		for k, v := range args(w) {
			if scientific.MatchString(v) {
				t.Errorf("%s %s=%s is in scientific notation", get(w, "metadata", "name"), k, v)
			}
		}
	}
	for _, d := range r.docs {
		name := str(get(d, "metadata", "name"))
		limit := 63
		if str(d["kind"]) == "StatefulSet" {
			limit = 52 // its pods carry a controller-revision-hash label of NAME-HASH
		}
		if len(name) > limit {
			t.Errorf("%s %s is longer than %d characters", d["kind"], name, limit)
		}
	}
}

// jsonish makes rendered YAML (ints) and values (float64) comparable.
func jsonish(v interface{}) interface{} {
	switch t := v.(type) {
	case obj:
		m := obj{}
		for k, x := range t {
			m[k] = jsonish(x)
		}
		return m
	case []interface{}:
		s := make([]interface{}, len(t))
		for i, x := range t {
			s[i] = jsonish(x)
		}
		return s
	case int:
		return float64(t)
	case int64:
		return float64(t)
	case nil:
		return obj{}
	}
	return v
}

func TestDefaultValues(t *testing.T) {
	r := render(t, "lr")
	checkDesign(t, r)
	if len(r.ofKind("ServiceMonitor")) != 0 || len(r.ofKind("Secret")) != 0 {
		t.Errorf("ServiceMonitor and TLS Secret must be off by default")
	}
	if got := len(r.docs); got != 14 {
		t.Errorf("%d manifests for default values, want 14 (3 workloads, 4 Services, 3 PDBs, 3 NetworkPolicies, the helm test Pod)", got)
	}
}

func TestMultiShardMultiWorkerValues(t *testing.T) {
	r := render(t, "prod", filepath.Join(*testdataDir, "values-multi.yaml"))
	checkDesign(t, r)
	if num(t, r.value("kvstore", "shards")) != 5 || num(t, r.value("worker", "replicas")) != 4 {
		t.Fatalf("values-multi.yaml was not applied: %v", r.value("kvstore"))
	}
	sms := r.ofKind("ServiceMonitor")
	if len(sms) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(sms))
	}
	sm := sms[0]
	if str(get(sm, "metadata", "labels", "release")) != "kube-prometheus-stack" || str(get(sm, "spec", "endpoints", 0, "port")) != "metrics" {
		t.Errorf("ServiceMonitor %v", sm)
	}
	scraped := 0
	for _, svc := range r.ofKind("Service") {
		if selects(get(sm, "spec", "selector", "matchLabels"), get(svc, "metadata", "labels")) {
			scraped++
			hasMetrics := false
			for _, p := range get(svc, "spec", "ports").([]interface{}) {
				hasMetrics = hasMetrics || str(get(p, "name")) == "metrics"
			}
			if !hasMetrics || !strings.HasPrefix(str(get(svc, "metadata", "labels", str(get(sm, "spec", "jobLabel")))), "lazyrag-") {
				t.Errorf("ServiceMonitor selects Service %s without a metrics port or job label", get(svc, "metadata", "name"))
			}
		}
	}
	if scraped != 3 {
		t.Errorf("ServiceMonitor selects %d Services, want 3 (kvstore, worker, router-metrics)", scraped)
	}
	secret := r.byKey["Secret/prod-lazyrag-tls"]
	if secret == nil || str(secret["type"]) != "kubernetes.io/tls" {
		t.Fatalf("TLS Secret missing: %v", r.byKey)
	}
	for _, k := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if str(get(secret, "data", k)) == "" {
			t.Errorf("TLS Secret has no %s", k)
		}
	}
	wk := r.workload(t, "StatefulSet", "worker")
	if img := str(get(wk, "spec", "template", "spec", "containers", 0, "image")); img != "registry.example.invalid/lazyrag/worker:1.2.3" {
		t.Errorf("worker image %q", img)
	}
	if _, ok := args(wk)["--max_running"]; !ok {
		t.Errorf("worker extraArgs not passed: %v", args(wk))
	}
	if str(get(wk, "spec", "template", "metadata", "labels", "team")) != "rag" {
		t.Errorf("commonLabels not on the worker pods")
	}
}

func TestCpuWorkerRequestsNoGPU(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "cpu.yaml")
	os.WriteFile(f, []byte("worker:\n  device: cpu\n  nodeSelector: null\n  tolerations: null\n  model:\n    source: image\n    path: synthetic:tiny\n"), 0o644)
	r := render(t, "cpu", f)
	checkDesign(t, r)
}

func TestLongReleaseNameKeepsNamesShort(t *testing.T) {
	checkDesign(t, render(t, strings.Repeat("a", 60)))
}

func TestInvalidValuesFailWithMessage(t *testing.T) {
	cases := map[string]string{
		"kvstore:\n  shards: 2\n  replication: 3\n":                                           "kvstore.replication must be between 0 and kvstore.shards (2), got 3",
		"kvstore:\n  shards: 0\n":                                                             "kvstore.shards must be at least 1",
		"worker:\n  model:\n    source: s3\n":                                                 `worker.model.source must be volume or image, got "s3"`,
		"worker:\n  device: tpu\n":                                                            `worker.device must be cuda or cpu, got "tpu"`,
		"worker:\n  model:\n    path: \"\"\n":                                                 "worker.model.path is required",
		"tls:\n  enabled: true\n":                                                             "tls.cert is required",
		"worker:\n  model:\n    source: volume\n    volume: null\n":                           "worker.model.volume is required",
		"worker:\n  hostCacheBytes: -5\n":                                                     "worker.hostCacheBytes must be -1 (sized from the pod), 0 (off) or a byte count, got -5",
		"router:\n  workerDiscovery: consul\n":                                                `router.workerDiscovery must be dns or static, got "consul"`,
		"auth:\n  enabled: true\n  workerIdentity: certificate\n  workerCertificateName: w\n": "auth.workerIdentity certificate needs tls.enabled",
		"auth:\n  enabled: true\n  workerIdentity: certificate\ntls:\n  enabled: true\n  existingSecret: t\n": "auth.workerCertificateName (the TLS certificate's subject common name) is required",
	}
	for values, want := range cases {
		f := filepath.Join(t.TempDir(), "bad.yaml")
		os.WriteFile(f, []byte(values), 0o644)
		_, err := Render(Options{ChartDir: *chartDir, ValuesFiles: []string{f}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("values %q: error %v, want one containing %q", values, err, want)
		}
	}
}

// Every value is documented: each key whose value is a scalar, a list or a free-form
// Kubernetes map has a comment on it; structural maps are documented through their keys.
func TestValuesDocumented(t *testing.T) {
	text, err := os.ReadFile(filepath.Join(*chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(text, &doc); err != nil {
		t.Fatal(err)
	}
	freeForm := map[string]bool{"resources": true, "nodeSelector": true, "tolerations": true, "affinity": true,
		"podAnnotations": true, "commonLabels": true, "labels": true, "annotations": true, "volume": true,
		"gpuNodeSelector":    true,
		"podSecurityContext": true, "securityContext": true}
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := strings.TrimPrefix(path+"."+k.Value, ".")
			if v.Kind == yaml.MappingNode && !freeForm[k.Value] {
				walk(v, p)
				continue
			}
			if k.HeadComment == "" && k.LineComment == "" && v.LineComment == "" {
				t.Errorf("values.yaml: %s has no comment", p)
			}
		}
	}
	walk(doc.Content[0], "")
}

// The renderer prints what `helm template` prints: one "# Source:" header per document.
func TestFormat(t *testing.T) {
	res, err := Render(Options{ChartDir: *chartDir})
	if err != nil {
		t.Fatal(err)
	}
	out := res.Format()
	if n := strings.Count(out, "\n# Source: lazyrag/templates/"); n != len(res.Manifests) || !bytes.HasPrefix([]byte(out), []byte("---\n")) {
		t.Errorf("%d Source headers for %d manifests", n, len(res.Manifests))
	}
}

// checkListenAddresses: --listen is HOST:PORT with an IPv6 host in brackets (how
// common/grpc_server.cc's ParseHostPort splits it), and --metrics_host is the bare address
// (the metrics server hands it to getaddrinfo), for every server.
func checkListenAddresses(t *testing.T, r *rendered, w obj) {
	t.Helper()
	name := str(get(w, "metadata", "name"))
	host := strings.TrimSuffix(strings.TrimPrefix(str(r.value("listenHost")), "["), "]")
	a := args(w)
	wantListen := fmt.Sprintf("%s:%d", host, containerPort(t, w, "grpc"))
	if strings.Contains(host, ":") {
		wantListen = fmt.Sprintf("[%s]:%d", host, containerPort(t, w, "grpc"))
	}
	if a["--listen"] != wantListen {
		t.Errorf("%s --listen=%q, want %q", name, a["--listen"], wantListen)
	}
	if a["--metrics_host"] != host {
		t.Errorf("%s --metrics_host=%q, want %q", name, a["--metrics_host"], host)
	}
}

// checkRestricted: the pod meets the "restricted" Pod Security Standard.
func checkRestricted(t *testing.T, w obj) {
	t.Helper()
	name := str(get(w, "metadata", "name"))
	pod := get(w, "spec", "template", "spec")
	if str(get(pod, "securityContext", "seccompProfile", "type")) != "RuntimeDefault" {
		t.Errorf("%s: pod seccompProfile %v, want RuntimeDefault", name, get(pod, "securityContext", "seccompProfile"))
	}
	for _, c := range get(pod, "containers").([]interface{}) {
		sc := get(c, "securityContext")
		if get(pod, "securityContext", "runAsNonRoot") != true && get(sc, "runAsNonRoot") != true {
			t.Errorf("%s: container %v may run as root", name, get(c, "name"))
		}
		if get(sc, "allowPrivilegeEscalation") != false {
			t.Errorf("%s: container %v allows privilege escalation", name, get(c, "name"))
		}
		if !reflect.DeepEqual(get(sc, "capabilities", "drop"), []interface{}{"ALL"}) || get(sc, "capabilities", "add") != nil {
			t.Errorf("%s: container %v capabilities %v, want drop [ALL]", name, get(c, "name"), get(sc, "capabilities"))
		}
	}
}

func writeValues(t *testing.T, text string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// Issue 27: two GPUs per worker run tensor-parallel; one GPU and CPU workers get no --tp.
func TestGpuWorkerTensorParallel(t *testing.T) {
	for values, want := range map[string]string{"worker:\n  gpus: 2\n": "2", "worker:\n  gpus: 1\n": "",
		"worker:\n  gpus: 4\n  device: cpu\n  model:\n    source: image\n    path: synthetic:tiny\n": ""} {
		r := render(t, "tp", writeValues(t, values))
		checkDesign(t, r)
		if got := args(r.workload(t, "StatefulSet", "worker"))["--tp"]; got != want {
			t.Errorf("values %q: --tp=%q, want %q", values, got, want)
		}
	}
}

// Issue 27: device cpu with the chart's default scheduling values gets no GPU node selector,
// toleration or resource.
func TestCpuWorkerDefaultsNoGPUScheduling(t *testing.T) {
	r := render(t, "cpu", filepath.Join(*testdataDir, "values-cpu.yaml"))
	checkDesign(t, r)
	pod := get(r.workload(t, "StatefulSet", "worker"), "spec", "template", "spec")
	text := fmt.Sprint(get(pod, "nodeSelector"), get(pod, "tolerations"), get(pod, "containers", 0, "resources"))
	if strings.Contains(text, "nvidia") {
		t.Errorf("a cpu worker pod asks for GPU nodes: %s", text)
	}
	gpu := get(render(t, "gpu").workload(t, "StatefulSet", "worker"), "spec", "template", "spec")
	if str(get(gpu, "nodeSelector", "nvidia.com/gpu.present")) != "true" || get(gpu, "tolerations", 0) == nil {
		t.Errorf("a cuda worker lost its GPU node selector or toleration: %v %v", get(gpu, "nodeSelector"), get(gpu, "tolerations"))
	}
}

// Issue 27: listenHost "::" (and "[::]") gives [::]:PORT listen addresses and a bare ::
// metrics host for every server.
func TestIPv6ListenAddresses(t *testing.T) {
	for _, host := range []string{`"::"`, `"[::]"`} {
		r := render(t, "v6", filepath.Join(*testdataDir, "values-ipv6.yaml"), writeValues(t, "listenHost: "+host+"\n"))
		checkDesign(t, r)
		for _, w := range []obj{r.workload(t, "StatefulSet", "kvstore"), r.workload(t, "StatefulSet", "worker"), r.workload(t, "Deployment", "router")} {
			if a := args(w); !strings.HasPrefix(a["--listen"], "[::]:") || a["--metrics_host"] != "::" {
				t.Errorf("listenHost %s: %s --listen=%q --metrics_host=%q", host, get(w, "metadata", "name"), a["--listen"], a["--metrics_host"])
			}
		}
	}
}

// Issue 27: with TLS the probes still check the process: readiness and startup run the images'
// TLS health client (lazyrag-cli health), liveness GETs /metrics (checkDesign checks each probe).
func TestTLSProbes(t *testing.T) {
	r := render(t, "tls", filepath.Join(*testdataDir, "values-tls.yaml"))
	checkDesign(t, r)
	wk := r.workload(t, "StatefulSet", "worker")
	start, _ := get(wk, "spec", "template", "spec", "containers", 0, "startupProbe", "exec", "command").([]interface{})
	if len(start) < 2 || str(start[1]) != "health" {
		t.Errorf("worker startupProbe with TLS: want lazyrag-cli health, got %v", start)
	}
	named := render(t, "tls2", filepath.Join(*testdataDir, "values-tls.yaml"), writeValues(t, "tls:\n  probeServerName: lazyrag.internal\n"))
	cmd, _ := get(named.workload(t, "Deployment", "router"), "spec", "template", "spec", "containers", 0, "readinessProbe", "exec", "command").([]interface{})
	if !containsStr(cmd, "--tls_server_name=lazyrag.internal") {
		t.Errorf("tls.probeServerName not passed: %v", cmd)
	}
}

func containsStr(list []interface{}, want string) bool {
	for _, x := range list {
		if str(x) == want {
			return true
		}
	}
	return false
}

// Issue 27: autoscaling hooks, off by default: an autoscaling/v2 HPA (CPU and custom metrics)
// or a KEDA ScaledObject per component, each aimed at its workload, which then leaves replicas
// to it; bad combinations fail with a message.
func TestAutoscaling(t *testing.T) {
	if n := len(render(t, "off").ofKind("HorizontalPodAutoscaler")) + len(render(t, "off").ofKind("ScaledObject")); n != 0 {
		t.Errorf("autoscaling is off by default, got %d objects", n)
	}
	r := render(t, "as", filepath.Join(*testdataDir, "values-autoscaling.yaml"))
	checkDesign(t, r)
	rt := r.workload(t, "Deployment", "router")
	wk := r.workload(t, "StatefulSet", "worker")
	for _, w := range []obj{rt, wk} {
		if get(w, "spec", "replicas") != nil {
			t.Errorf("%s keeps spec.replicas under an autoscaler", get(w, "metadata", "name"))
		}
	}
	hpas := r.ofKind("HorizontalPodAutoscaler")
	if len(hpas) != 1 {
		t.Fatalf("%d HPAs, want 1 (router)", len(hpas))
	}
	h := hpas[0]
	if str(h["apiVersion"]) != "autoscaling/v2" || str(get(h, "spec", "scaleTargetRef", "kind")) != "Deployment" ||
		str(get(h, "spec", "scaleTargetRef", "name")) != str(get(rt, "metadata", "name")) {
		t.Errorf("router HPA does not target the router Deployment: %v", get(h, "spec"))
	}
	if num(t, get(h, "spec", "minReplicas")) != 2 || num(t, get(h, "spec", "maxReplicas")) != 6 {
		t.Errorf("router HPA bounds %v", get(h, "spec"))
	}
	if str(get(h, "spec", "metrics", 0, "resource", "name")) != "cpu" || num(t, get(h, "spec", "metrics", 0, "resource", "target", "averageUtilization")) != 60 ||
		str(get(h, "spec", "metrics", 1, "pods", "metric", "name")) != "lazyrag_requests_waiting" {
		t.Errorf("router HPA metrics %v", get(h, "spec", "metrics"))
	}
	sos := r.ofKind("ScaledObject")
	if len(sos) != 1 {
		t.Fatalf("%d ScaledObjects, want 1 (worker)", len(sos))
	}
	so := sos[0]
	if str(get(so, "spec", "scaleTargetRef", "kind")) != "StatefulSet" || str(get(so, "spec", "scaleTargetRef", "name")) != str(get(wk, "metadata", "name")) {
		t.Errorf("worker ScaledObject target %v", get(so, "spec", "scaleTargetRef"))
	}
	q := str(get(so, "spec", "triggers", 0, "metadata", "query"))
	if !strings.Contains(q, "lazyrag_requests_waiting{namespace=\"rag\",job=\""+str(get(wk, "metadata", "name"))+"\"}") {
		t.Errorf("worker KEDA default query %q", q)
	}
	for _, bad := range []struct{ values, message string }{
		{"router:\n  autoscaling: {enabled: true}\n  keda: {enabled: true, serverAddress: http://p:9090}\n", "exclude each other"},
		{"worker:\n  autoscaling: {enabled: true}\n", "set targetCPUUtilizationPercentage or metrics"},
		{"router:\n  autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}\n", "minReplicas <= maxReplicas"},
		{"router:\n  workerDiscovery: static\nworker:\n  keda: {enabled: true, serverAddress: http://p:9090}\n", "needs router.workerDiscovery dns"},
		{"worker:\n  keda: {enabled: true}\n", "worker.keda.serverAddress is required"},
	} {
		_, err := Render(Options{ChartDir: *chartDir, ValuesFiles: []string{writeValues(t, bad.values)}, ReleaseName: "bad", Namespace: "rag"})
		if err == nil || !strings.Contains(err.Error(), bad.message) {
			t.Errorf("values %q: want an error with %q, got %v", bad.values, bad.message, err)
		}
	}
}

// Issue 27: NOTES.txt tells how to run the chart's test pod.
func TestNotesMentionHelmTest(t *testing.T) {
	notes, err := os.ReadFile(filepath.Join(*chartDir, "templates", "NOTES.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(notes), "helm test") {
		t.Errorf("NOTES.txt does not mention helm test:\n%s", notes)
	}
}

// Issue 27: NetworkPolicies (on by default): kvstore gRPC from workers only, worker gRPC from
// routers only, router gRPC from anyone, metrics ports from networkPolicy.metricsFrom.
func TestNetworkPolicies(t *testing.T) {
	r := render(t, "np", filepath.Join(*testdataDir, "values-tls.yaml"))
	labels := func(component, kind string) interface{} {
		return get(r.workload(t, kind, component), "spec", "template", "metadata", "labels")
	}
	kinds := map[string]string{"kvstore": "StatefulSet", "worker": "StatefulSet", "router": "Deployment"}
	allowedFrom := map[string]string{"kvstore": "worker", "worker": "router", "router": ""}
	policies := r.ofKind("NetworkPolicy")
	if len(policies) != 3 {
		t.Fatalf("%d NetworkPolicies, want 3", len(policies))
	}
	for component, from := range allowedFrom {
		var np obj
		for _, p := range policies {
			if selects(get(p, "spec", "podSelector", "matchLabels"), labels(component, kinds[component])) {
				np = p
			}
		}
		if np == nil {
			t.Errorf("no NetworkPolicy selects the %s pods", component)
			continue
		}
		grpcPort := num(t, r.value(component, "grpcPort"))
		metricsPort := num(t, r.value(component, "metricsPort"))
		for _, rule := range get(np, "spec", "ingress").([]interface{}) {
			port := num(t, get(rule, "ports", 0, "port"))
			peers, _ := get(rule, "from").([]interface{})
			switch port {
			case grpcPort:
				if from == "" {
					if len(peers) != 0 {
						t.Errorf("%s gRPC must be open to anyone, from %v", component, peers)
					}
				} else if want := get(r.workload(t, kinds[from], from), "spec", "selector", "matchLabels"); len(peers) != 1 ||
					!reflect.DeepEqual(get(peers[0], "podSelector", "matchLabels"), want) || len(peers[0].(obj)) != 1 {
					t.Errorf("%s gRPC ingress from %v, want only the %s pods", component, peers, from)
				}
			case metricsPort:
				if !reflect.DeepEqual(jsonish(obj{"p": peers}), jsonish(obj{"p": r.value("networkPolicy", "metricsFrom")})) {
					t.Errorf("%s metrics ingress from %v, want networkPolicy.metricsFrom", component, peers)
				}
			default:
				t.Errorf("%s NetworkPolicy opens port %d", component, port)
			}
		}
	}
	if n := len(render(t, "off", writeValues(t, "networkPolicy:\n  enabled: false\n")).ofKind("NetworkPolicy")); n != 0 {
		t.Errorf("networkPolicy.enabled false: %d NetworkPolicies", n)
	}
}

// repoFile reads a file of the repository (the chart is deploy/helm/lazyrag in it).
func repoFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(*chartDir, "..", "..", "..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Issue 27: with values-monitoring.yaml the chart renders a PrometheusRule holding exactly the
// rule groups of deploy/prometheus/alerts.yml and a dashboard ConfigMap holding exactly
// deploy/grafana/lazyrag.json (with the configured sidecar label); both are off by default.
func TestMonitoringObjects(t *testing.T) {
	r := render(t, "mon", filepath.Join(*testdataDir, "values-monitoring.yaml"))
	checkDesign(t, r)
	rules := r.ofKind("PrometheusRule")
	if len(rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(rules))
	}
	pr := rules[0]
	if str(pr["apiVersion"]) != "monitoring.coreos.com/v1" || str(get(pr, "metadata", "labels", "release")) != "kube-prometheus-stack" {
		t.Errorf("PrometheusRule apiVersion %v labels %v", pr["apiVersion"], get(pr, "metadata", "labels"))
	}
	var alerts obj
	if err := yaml.Unmarshal(repoFile(t, "deploy/prometheus/alerts.yml"), &alerts); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(jsonish(get(pr, "spec", "groups")), jsonish(alerts["groups"])) {
		t.Errorf("PrometheusRule spec.groups differ from deploy/prometheus/alerts.yml")
	}
	groups, _ := get(pr, "spec", "groups").([]interface{})
	nrules := 0
	for _, g := range groups {
		if str(get(g, "name")) == "" {
			t.Errorf("a rule group without a name")
		}
		rs, _ := get(g, "rules").([]interface{})
		for _, rule := range rs {
			nrules++
			if (str(get(rule, "alert")) == "") == (str(get(rule, "record")) == "") || str(get(rule, "expr")) == "" {
				t.Errorf("rule %v: needs exactly one of alert/record and an expr", rule)
			}
			for k := range rule.(obj) {
				switch k {
				case "alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for":
				default:
					t.Errorf("rule %v: field %q is not a PrometheusRule Rule field", get(rule, "alert"), k)
				}
			}
		}
	}
	if len(groups) == 0 || nrules == 0 {
		t.Errorf("PrometheusRule has %d groups, %d rules", len(groups), nrules)
	}

	cm := r.byKey["ConfigMap/mon-lazyrag-dashboard"]
	if cm == nil {
		t.Fatalf("no dashboard ConfigMap: %v", r.byKey)
	}
	if str(get(cm, "metadata", "labels", "lazyrag_dashboard")) != "yes" || str(get(cm, "metadata", "annotations", "grafana_folder")) != "lazyrag" {
		t.Errorf("dashboard ConfigMap labels %v annotations %v", get(cm, "metadata", "labels"), get(cm, "metadata", "annotations"))
	}
	if got, want := str(get(cm, "data", "lazyrag.json")), string(repoFile(t, "deploy/grafana/lazyrag.json")); got != want {
		t.Errorf("dashboard ConfigMap data differs from deploy/grafana/lazyrag.json (%d vs %d bytes)", len(got), len(want))
	}

	def := render(t, "def")
	if len(def.ofKind("PrometheusRule")) != 0 || len(def.ofKind("ConfigMap")) != 0 {
		t.Errorf("PrometheusRule / dashboard ConfigMap must be off by default")
	}
	sidecar := render(t, "sc", writeValues(t, "monitoring:\n  grafanaDashboard:\n    enabled: true\n"))
	if str(get(sidecar.byKey["ConfigMap/sc-lazyrag-dashboard"], "metadata", "labels", "grafana_dashboard")) != "1" {
		t.Errorf("default sidecar label grafana_dashboard: \"1\" missing")
	}
}

// Issue 27: env, extraVolumes, extraVolumeMounts, priorityClassName and
// topologySpreadConstraints of each component reach its pods; by default none is set.
func TestPodPassThroughValues(t *testing.T) {
	contains := func(list interface{}, item interface{}) bool {
		l, _ := list.([]interface{})
		for _, x := range l {
			if reflect.DeepEqual(jsonish(x), jsonish(item)) {
				return true
			}
		}
		return false
	}
	kinds := map[string]string{"kvstore": "StatefulSet", "worker": "StatefulSet", "router": "Deployment"}
	r := render(t, "pt", filepath.Join(*testdataDir, "values-monitoring.yaml"))
	def := render(t, "pt")
	for component, kind := range kinds {
		pod := get(r.workload(t, kind, component), "spec", "template", "spec")
		c := get(pod, "containers", 0)
		for _, key := range []string{"env", "extraVolumes", "extraVolumeMounts", "topologySpreadConstraints"} {
			items, _ := r.value(component, key).([]interface{})
			if len(items) == 0 {
				t.Fatalf("values-monitoring.yaml sets no %s.%s", component, key)
			}
			target := map[string]interface{}{"env": get(c, "env"), "extraVolumes": get(pod, "volumes"),
				"extraVolumeMounts": get(c, "volumeMounts"), "topologySpreadConstraints": get(pod, "topologySpreadConstraints")}[key]
			for _, item := range items {
				if !contains(target, item) {
					t.Errorf("%s: %s item %v not rendered (got %v)", component, key, item, target)
				}
			}
		}
		if got, want := str(get(pod, "priorityClassName")), str(r.value(component, "priorityClassName")); got != want || want == "" {
			t.Errorf("%s priorityClassName %q, want %q", component, got, want)
		}
		// Every mount names a volume of the pod (or a claim template).
		names := map[string]bool{}
		for _, v := range append(asList(get(pod, "volumes")), asList(get(r.workload(t, kind, component), "spec", "volumeClaimTemplates"))...) {
			names[str(get(v, "name"))] = true
			names[str(get(v, "metadata", "name"))] = true
		}
		for _, m := range asList(get(c, "volumeMounts")) {
			if !names[str(get(m, "name"))] {
				t.Errorf("%s mounts %v, which is no volume of the pod", component, get(m, "name"))
			}
		}
		dpod := get(def.workload(t, kind, component), "spec", "template", "spec")
		if get(dpod, "priorityClassName") != nil || get(dpod, "topologySpreadConstraints") != nil {
			t.Errorf("%s: priorityClassName / topologySpreadConstraints set by default", component)
		}
		if component != "worker" && get(dpod, "containers", 0, "env") != nil {
			t.Errorf("%s: env set by default", component)
		}
	}
}

func asList(v interface{}) []interface{} {
	l, _ := v.([]interface{})
	return l
}

// Issue 27: the `helm test` pod connects to the router Service's gRPC port with the router
// image (it has bash), restricted like the other pods; helmTest.image / enabled work.
func TestHelmTestPod(t *testing.T) {
	for _, files := range [][]string{nil, {filepath.Join(*testdataDir, "values-tls.yaml")}, {filepath.Join(*testdataDir, "values-monitoring.yaml")}} {
		r := render(t, "ht", files...)
		pods := r.ofKind("Pod")
		if len(pods) != 1 {
			t.Fatalf("%v: %d test pods, want 1", files, len(pods))
		}
		pod := pods[0]
		if str(get(pod, "metadata", "annotations", "helm.sh/hook")) != "test" || str(get(pod, "spec", "restartPolicy")) != "Never" {
			t.Errorf("test pod annotations %v restartPolicy %v", get(pod, "metadata", "annotations"), get(pod, "spec", "restartPolicy"))
		}
		rt := r.workload(t, "Deployment", "router")
		c := get(pod, "spec", "containers", 0)
		if got, want := str(get(c, "image")), str(get(rt, "spec", "template", "spec", "containers", 0, "image")); got != want {
			t.Errorf("test pod image %q, want the router image %q", got, want)
		}
		svc := r.byKey["Service/"+str(get(rt, "metadata", "name"))]
		target := fmt.Sprintf("/dev/tcp/%s.rag.svc.%s/%d", get(svc, "metadata", "name"), r.value("clusterDomain"), num(t, get(svc, "spec", "ports", 0, "port")))
		cmd := fmt.Sprint(get(c, "command"))
		if !strings.HasPrefix(cmd, "[bash -c ") || !strings.Contains(cmd, target) {
			t.Errorf("test pod command %s does not open %s", cmd, target)
		}
		if get(pod, "spec", "securityContext", "runAsNonRoot") != true || str(get(pod, "spec", "securityContext", "seccompProfile", "type")) != "RuntimeDefault" ||
			get(c, "securityContext", "allowPrivilegeEscalation") != false || !reflect.DeepEqual(get(c, "securityContext", "capabilities", "drop"), []interface{}{"ALL"}) {
			t.Errorf("test pod is not restricted: %v %v", get(pod, "spec", "securityContext"), get(c, "securityContext"))
		}
	}
	if n := len(render(t, "ht", writeValues(t, "helmTest:\n  enabled: false\n")).ofKind("Pod")); n != 0 {
		t.Errorf("helmTest.enabled false: %d test pods", n)
	}
	r := render(t, "ht", writeValues(t, "helmTest:\n  image: busybox-with-bash:1\n"))
	if img := str(get(r.ofKind("Pod")[0], "spec", "containers", 0, "image")); img != "busybox-with-bash:1" {
		t.Errorf("helmTest.image not used: %q", img)
	}
}

// Issue 27: the default image tag is the project version (CMakeLists.txt project VERSION),
// which is also the chart's appVersion, and every rendered image carries it.
func TestImageTagIsProjectVersion(t *testing.T) {
	m := regexp.MustCompile(`(?m)^project\(\s*lazyrag\s+VERSION\s+([0-9][0-9.]*)`).FindSubmatch(repoFile(t, "CMakeLists.txt"))
	if m == nil {
		t.Fatal("no project(lazyrag VERSION ...) in CMakeLists.txt")
	}
	version := string(m[1])
	r := render(t, "ver")
	if got := str(r.value("image", "tag")); got != version {
		t.Errorf("values.yaml image.tag %q, want the project version %q", got, version)
	}
	chart, err := loadChart(filepath.Join(*chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if got := str(chart["AppVersion"]); got != version {
		t.Errorf("Chart.yaml appVersion %q, want the project version %q", got, version)
	}
	for _, d := range r.docs {
		spec := get(d, "spec", "template", "spec")
		if spec == nil {
			spec = get(d, "spec")
		}
		for _, c := range asList(get(spec, "containers")) {
			if img := str(get(c, "image")); !strings.HasSuffix(img, ":"+version) {
				t.Errorf("%s/%s image %q is not tagged %s", d["kind"], get(d, "metadata", "name"), img, version)
			}
		}
	}
}

// Renders testdata/VALUES (release "auth") and returns it, its generated auth Secret and the
// Secret's tokens file, which must hold every line of `lines`.
func renderAuthSecret(t *testing.T, values string, lines ...string) (*rendered, obj, string) {
	t.Helper()
	r := render(t, "auth", filepath.Join(*testdataDir, values))
	secret := r.byKey["Secret/auth-lazyrag-auth"]
	if secret == nil {
		t.Fatalf("no generated auth Secret; rendered %v", keys(r.byKey))
	}
	tokens := str(get(secret, "stringData", "tokens"))
	for _, line := range lines {
		if !strings.Contains(tokens, line) {
			t.Errorf("tokens file lacks %q:\n%s", line, tokens)
		}
	}
	return r, secret, tokens
}

// Issue 28: with auth every server checks the tokens file; the router and workers send the
// worker token; only workers get the MAC key, and the kvstore's volume projects only `tokens`.
// The generated Secret lists the worker token with role worker and every client token. Without
// auth nothing of it renders.
func TestAuthSecrets(t *testing.T) {
	r, secret, _ := renderAuthSecret(t, "values-auth.yaml", "cluster-worker-token-001 cluster worker",
		"acme-client-token-000001 acme client", "globex-client-token-0001 globex client")
	if str(get(secret, "stringData", "worker-token")) != "cluster-worker-token-001" {
		t.Errorf("worker-token = %q", get(secret, "stringData", "worker-token"))
	}
	want := map[string][]string{
		"kvstore": {"--auth_tokens_file"},
		"worker":  {"--auth_tokens_file", "--auth_token_file", "--kv_mac_key_file", "--public_namespaces"},
		"router":  {"--auth_tokens_file", "--auth_token_file", "--public_namespaces"},
	}
	items := map[string][]string{"kvstore": {"tokens"}, "worker": {"tokens", "worker-token", "mac-key"}, "router": {"tokens", "worker-token"}}
	kinds := map[string]string{"kvstore": "StatefulSet", "worker": "StatefulSet", "router": "Deployment"}
	for component, flags := range want {
		w := r.workload(t, kinds[component], component)
		a := args(w)
		for _, f := range flags {
			if _, ok := a[f]; !ok {
				t.Errorf("%s lacks %s (args %v)", component, f, a)
			}
		}
		if component != "worker" {
			if _, ok := a["--kv_mac_key_file"]; ok {
				t.Errorf("%s gets the MAC key", component)
			}
		}
		var got []string
		for _, v := range get(w, "spec", "template", "spec", "volumes").([]interface{}) {
			if str(get(v, "name")) != "auth" {
				continue
			}
			for _, it := range get(v, "secret", "items").([]interface{}) {
				got = append(got, str(get(it, "key")))
			}
		}
		if strings.Join(got, ",") != strings.Join(items[component], ",") {
			t.Errorf("%s mounts auth keys %v, want %v", component, got, items[component])
		}
	}
	if a := args(r.workload(t, "StatefulSet", "worker")); a["--public_namespaces"] != "shared,wiki" {
		t.Errorf("--public_namespaces=%q", a["--public_namespaces"])
	}

	existing := render(t, "auth", filepath.Join(*testdataDir, "values-auth-secret.yaml"))
	if existing.byKey["Secret/auth-lazyrag-auth"] != nil {
		t.Errorf("a Secret was generated although auth.existingSecret is set")
	}
	for _, v := range get(existing.workload(t, "StatefulSet", "worker"), "spec", "template", "spec", "volumes").([]interface{}) {
		if str(get(v, "name")) == "auth" && str(get(v, "secret", "secretName")) != "lazyrag-auth" {
			t.Errorf("auth volume from %q, want lazyrag-auth", get(v, "secret", "secretName"))
		}
	}
	off := render(t, "auth", nil...)
	if _, ok := args(off.workload(t, "StatefulSet", "worker"))["--auth_tokens_file"]; ok {
		t.Errorf("auth flags without auth.enabled")
	}
}

// auth.workerIdentity certificate: the tokens file names the certificate as the cluster's worker
// (x509:NAME) and holds no worker token; the router and workers neither mount nor send one, and
// every server still checks the tokens file over mTLS.
func TestAuthCertificateIdentity(t *testing.T) {
	r, secret, tokens := renderAuthSecret(t, "values-auth-certificate.yaml",
		"x509:lazyrag-worker.rag.svc cluster worker", "acme-client-token-000001 acme client")
	if n := strings.Count(tokens, " worker"); n != 1 {
		t.Errorf("tokens file has %d worker lines, want the certificate's only:\n%s", n, tokens)
	}
	if _, ok := get(secret, "stringData").(obj)["worker-token"]; ok {
		t.Errorf("a worker-token key although workers are known by certificate")
	}
	kinds := map[string]string{"kvstore": "StatefulSet", "worker": "StatefulSet", "router": "Deployment"}
	for component, kind := range kinds {
		w := r.workload(t, kind, component)
		a := args(w)
		if _, ok := a["--auth_tokens_file"]; !ok {
			t.Errorf("%s lacks --auth_tokens_file (args %v)", component, a)
		}
		if _, ok := a["--auth_token_file"]; ok {
			t.Errorf("%s sends a token although workers are known by certificate", component)
		}
		if _, ok := a["--tls_cert"]; !ok {
			t.Errorf("%s lacks --tls_cert: its certificate is its identity", component)
		}
		for _, v := range get(w, "spec", "template", "spec", "volumes").([]interface{}) {
			if str(get(v, "name")) != "auth" {
				continue
			}
			for _, it := range get(v, "secret", "items").([]interface{}) {
				if str(get(it, "key")) == "worker-token" {
					t.Errorf("%s mounts worker-token", component)
				}
			}
		}
	}
}

func keys(m map[string]obj) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
