{{/*
Helpers of the lazyrag chart. They use only Go template built-ins, Helm's include, required,
toYaml and fromYaml, and a few sprig functions (default, trunc, trimPrefix, trimSuffix, contains, quote, nindent,
int, int64, toString, add, div, until, list, append, has, join, dict, set, deepCopy, b64enc,
fail), so that tests/deploy/helmrender can render the chart without Helm.

Context conventions: helpers named *.component take (dict "root" $ "component" NAME), where
NAME is kvstore, worker or router; the others take the root context $.
*/}}

{{/* Chart name, possibly overridden. */}}
{{- define "lazyrag.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every resource name. 40 characters at most, so that "PREFIX-kvstore" stays under
the 52 characters a StatefulSet name may have (its pods get a 63-character
controller-revision-hash label).
*/}}
{{- define "lazyrag.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Name of a component's workload and of its Service: PREFIX-COMPONENT. */}}
{{- define "lazyrag.component.name" -}}
{{- printf "%s-%s" (include "lazyrag.fullname" .root) .component -}}
{{- end -}}

{{/* Labels that select a component's pods (stable: never change them on upgrade). */}}
{{- define "lazyrag.component.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lazyrag.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* All labels of a component's resources and pods. */}}
{{- define "lazyrag.component.labels" -}}
{{ include "lazyrag.component.selectorLabels" . }}
app.kubernetes.io/part-of: lazyrag
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Image reference REGISTRY/REPOSITORY:TAG of a component. */}}
{{- define "lazyrag.component.image" -}}
{{- $image := index .root.Values .component "image" -}}
{{- $tag := default (default .root.Chart.AppVersion .root.Values.image.tag) $image.tag -}}
{{- printf "%s%s:%s" .root.Values.image.registry $image.repository $tag -}}
{{- end -}}

{{/*
Pod annotations: the Prometheus scrape annotations (metrics.podAnnotations) and the
component's podAnnotations. Takes (dict "root" $ "component" NAME).
*/}}
{{- define "lazyrag.component.podAnnotations" -}}
{{- $values := index .root.Values .component -}}
{{- $annotations := dict -}}
{{- if .root.Values.metrics.podAnnotations -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (toString (int $values.metricsPort)) -}}
{{- $_ := set $annotations "prometheus.io/path" "/metrics" -}}
{{- end -}}
{{- range $key, $value := $values.podAnnotations -}}
{{- $_ := set $annotations $key $value -}}
{{- end -}}
{{- toYaml $annotations -}}
{{- end -}}

{{/*
Scheduling and pod-level settings shared by every pod spec: pull secrets, security context,
node selector, tolerations, affinity. Takes (dict "root" $ "component" NAME "affinity" MAP
"gpu" BOOL), where affinity is used when the component's own affinity value is empty, and gpu
adds the component's gpuNodeSelector and gpuTolerations (GPU workers only).
*/}}
{{- define "lazyrag.component.podSettings" -}}
{{- $values := index .root.Values .component -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.podSecurityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $nodeSelector := dict -}}
{{- range $key, $value := $values.nodeSelector -}}
{{- $_ := set $nodeSelector $key $value -}}
{{- end -}}
{{- $tolerations := list -}}
{{- range $values.tolerations -}}
{{- $tolerations = append $tolerations . -}}
{{- end -}}
{{- if .gpu -}}
{{- range $key, $value := $values.gpuNodeSelector -}}
{{- $_ := set $nodeSelector $key $value -}}
{{- end -}}
{{- range $values.gpuTolerations -}}
{{- $tolerations = append $tolerations . -}}
{{- end -}}
{{- end -}}
{{- with $nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default .affinity $values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Soft anti-affinity that spreads a component's pods over nodes. */}}
{{- define "lazyrag.component.spreadAffinity" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "lazyrag.component.selectorLabels" . | nindent 12 }}
{{- end -}}

{{/*
Readiness, liveness and (with startupSeconds) startup probes. Without TLS all three are the
kubelet's gRPC probe of grpc.health.v1.Health on the gRPC port. The kubelet's gRPC probe
cannot speak TLS, so with tls.enabled readiness and startup run the images' TLS health client
(`lazyrag-cli health`, exec) against the gRPC port with the pod's own certificate, checking the
server's certificate against tls.probeServerName (default: the component's Service name), and
liveness GETs /metrics on the plain-HTTP metrics port, which only answers while the process
serves requests.
Takes (dict "root" $ "port" GRPC_PORT "metricsPort" METRICS_PORT "startupSeconds" N
"component" NAME).
*/}}
{{- define "lazyrag.probes" -}}
{{- $p := .root.Values.probes -}}
{{- $check := printf "grpc:\n  port: %d\n  service: \"\"" (int .port) -}}
{{- $live := $check -}}
{{- if .root.Values.tls.enabled -}}
{{- $t := .root.Values.tls -}}
{{- $name := default (include "lazyrag.component.name" (dict "root" .root "component" .component)) $t.probeServerName -}}
{{- $cmd := list "/usr/local/bin/lazyrag-cli" "health" (printf "--target=localhost:%d" (int .port)) (printf "--tls_ca=%s/ca.crt" $t.mountPath) (printf "--tls_cert=%s/tls.crt" $t.mountPath) (printf "--tls_key=%s/tls.key" $t.mountPath) (printf "--tls_server_name=%s" $name) (printf "--timeout_s=%d" (int $p.timeoutSeconds)) -}}
{{- $check = printf "exec:\n  command:\n%s" (toYaml $cmd | indent 4) -}}
{{- $live = printf "httpGet:\n  path: /metrics\n  port: %d" (int .metricsPort) -}}
{{- end -}}
readinessProbe:
  {{- $check | nindent 2 }}
  periodSeconds: {{ int $p.readinessPeriodSeconds }}
  timeoutSeconds: {{ int $p.timeoutSeconds }}
livenessProbe:
  {{- $live | nindent 2 }}
  periodSeconds: {{ int $p.livenessPeriodSeconds }}
  timeoutSeconds: {{ int $p.timeoutSeconds }}
  failureThreshold: {{ int $p.livenessFailureThreshold }}
{{- if .startupSeconds }}
startupProbe:
  {{- $check | nindent 2 }}
  periodSeconds: 10
  timeoutSeconds: {{ int $p.timeoutSeconds }}
  failureThreshold: {{ add 1 (div (int .startupSeconds) 10) }}
{{- end }}
{{- end -}}

{{/* "replicas: N" unless an autoscaler (HPA or KEDA) owns the component's replica count. */}}
{{- define "lazyrag.replicas" -}}
{{- $v := index .root.Values .component -}}
{{- if not (or $v.autoscaling.enabled $v.keda.enabled) -}}
replicas: {{ int $v.replicas }}
{{- end -}}
{{- end -}}

{{/* Name of the Secret that holds tls.crt, tls.key and ca.crt. */}}
{{- define "lazyrag.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "lazyrag.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{/* Flags that make a binary serve and dial gRPC over TLS (a YAML list, maybe empty). */}}
{{- define "lazyrag.tlsArgs" -}}
{{- if .Values.tls.enabled -}}
- --tls_cert={{ .Values.tls.mountPath }}/tls.crt
- --tls_key={{ .Values.tls.mountPath }}/tls.key
- --tls_ca={{ .Values.tls.mountPath }}/ca.crt
{{- end -}}
{{- end -}}

{{/* volumeMounts entry of the TLS Secret (empty without TLS). */}}
{{- define "lazyrag.tlsVolumeMount" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  mountPath: {{ .Values.tls.mountPath }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* volumes entry of the TLS Secret (empty without TLS). */}}
{{- define "lazyrag.tlsVolume" -}}
{{- if .Values.tls.enabled -}}
- name: tls
  secret:
    secretName: {{ include "lazyrag.tlsSecretName" . }}
    defaultMode: 0440
{{- end -}}
{{- end -}}

{{/* Name of the Secret that holds tokens, worker-token and mac-key. */}}
{{- define "lazyrag.authSecretName" -}}
{{- default (printf "%s-auth" (include "lazyrag.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/*
Authentication flags of one component (dict root, component: kvstore|worker|router; a YAML list,
maybe empty): every server checks the tokens file; the router and workers send the worker token
(auth.workerIdentity token; with certificate their TLS client certificate is the identity);
only workers get the MAC key.
*/}}
{{- define "lazyrag.authArgs" -}}
{{- $a := .root.Values.auth -}}
{{- if $a.enabled -}}
- --auth_tokens_file={{ $a.mountPath }}/tokens
{{- if ne .component "kvstore" }}
{{- if ne $a.workerIdentity "certificate" }}
- --auth_token_file={{ $a.mountPath }}/worker-token
{{- end }}
{{- with $a.publicNamespaces }}
- {{ printf "--public_namespaces=%s" (join "," .) | quote }}
{{- end }}
{{- end }}
{{- if eq .component "worker" }}
- --kv_mac_key_file={{ $a.mountPath }}/mac-key
{{- end }}
{{- end -}}
{{- end -}}

{{/* volumeMounts entry of the auth Secret (dict root; empty without auth). */}}
{{- define "lazyrag.authVolumeMount" -}}
{{- if .root.Values.auth.enabled -}}
- name: auth
  mountPath: {{ .root.Values.auth.mountPath }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/*
volumes entry of the auth Secret (dict root, component; empty without auth). Each component
sees only the keys it needs: the kvstore never the MAC key or a worker token.
*/}}
{{- define "lazyrag.authVolume" -}}
{{- if .root.Values.auth.enabled -}}
- name: auth
  secret:
    secretName: {{ include "lazyrag.authSecretName" .root }}
    defaultMode: 0440
    items:
      - {key: tokens, path: tokens}
      {{- if and (ne .component "kvstore") (ne .root.Values.auth.workerIdentity "certificate") }}
      - {key: worker-token, path: worker-token}
      {{- end }}
      {{- if eq .component "worker" }}
      - {key: mac-key, path: mac-key}
      {{- end }}
{{- end -}}
{{- end -}}

{{/*
Comma-separated gRPC addresses of every kvstore shard, by its stable StatefulSet pod name
under the headless Service: PREFIX-kvstore-I.PREFIX-kvstore.NAMESPACE.svc.DOMAIN:PORT.
*/}}
{{- define "lazyrag.kvstoreAddresses" -}}
{{- $name := include "lazyrag.component.name" (dict "root" . "component" "kvstore") -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.kvstore.shards) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.kvstore.grpcPort)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/*
The router's --workers: by default (router.workerDiscovery dns) dns:///NAME:PORT of the
workers' headless Service, which resolves to every worker pod's address and which the router
re-resolves every --resolve_interval_s, so scaling the workers needs no router restart. With
static: a comma-separated list of every worker's stable name, as for the kvstore shards.
*/}}
{{- define "lazyrag.workerAddresses" -}}
{{- $name := include "lazyrag.component.name" (dict "root" . "component" "worker") -}}
{{- if eq .Values.router.workerDiscovery "static" -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.worker.replicas) -}}
{{- $addresses = append $addresses (printf "%s-%d.%s.%s.svc.%s:%d" $name $i $name $.Release.Namespace $.Values.clusterDomain (int $.Values.worker.grpcPort)) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- else -}}
{{- printf "dns:///%s.%s.svc.%s:%d" $name .Release.Namespace .Values.clusterDomain (int .Values.worker.grpcPort) -}}
{{- end -}}
{{- end -}}

{{/*
listenHost without brackets ("::" for "[::]"): the form --metrics_host takes (the metrics
server hands it to getaddrinfo).
*/}}
{{- define "lazyrag.bareListenHost" -}}
{{- .Values.listenHost | toString | trimPrefix "[" | trimSuffix "]" -}}
{{- end -}}

{{/*
A server's --listen address HOST:PORT: an IPv6 host goes in brackets ([::]:50051), which is
how common/grpc_server.cc's ParseHostPort tells the port from the address.
Takes (dict "root" $ "port" PORT).
*/}}
{{- define "lazyrag.listenAddress" -}}
{{- $host := include "lazyrag.bareListenHost" .root -}}
{{- if contains ":" $host -}}
{{- printf "[%s]:%d" $host (int .port) -}}
{{- else -}}
{{- printf "%s:%d" $host (int .port) -}}
{{- end -}}
{{- end -}}

{{/* Fails the render, with a message naming the value, on values the chart cannot serve. */}}
{{- define "lazyrag.validate" -}}
{{- if lt (int .Values.kvstore.shards) 1 -}}
{{- fail "kvstore.shards must be at least 1" -}}
{{- end -}}
{{- if or (lt (int .Values.kvstore.replication) 0) (gt (int .Values.kvstore.replication) (int .Values.kvstore.shards)) -}}
{{- fail (printf "kvstore.replication must be between 0 and kvstore.shards (%d), got %d" (int .Values.kvstore.shards) (int .Values.kvstore.replication)) -}}
{{- end -}}
{{- if lt (int .Values.worker.replicas) 1 -}}
{{- fail "worker.replicas must be at least 1" -}}
{{- end -}}
{{- if lt (int .Values.router.replicas) 1 -}}
{{- fail "router.replicas must be at least 1" -}}
{{- end -}}
{{- if not (has .Values.router.workerDiscovery (list "dns" "static")) -}}
{{- fail (printf "router.workerDiscovery must be dns or static, got %q" (toString .Values.router.workerDiscovery)) -}}
{{- end -}}
{{- if not (has .Values.worker.device (list "cuda" "cpu")) -}}
{{- fail (printf "worker.device must be cuda or cpu, got %q" (toString .Values.worker.device)) -}}
{{- end -}}
{{- if and (eq .Values.worker.device "cuda") (lt (int .Values.worker.gpus) 1) -}}
{{- fail "worker.gpus must be at least 1 with worker.device cuda" -}}
{{- end -}}
{{- if not (has .Values.worker.model.source (list "volume" "image")) -}}
{{- fail (printf "worker.model.source must be volume or image, got %q" (toString .Values.worker.model.source)) -}}
{{- end -}}
{{- $_ := required "worker.model.path is required" .Values.worker.model.path -}}
{{- if eq .Values.worker.model.source "volume" -}}
{{- $_ := required "worker.model.volume is required with worker.model.source volume" .Values.worker.model.volume -}}
{{- end -}}
{{- if lt (int .Values.worker.pageSize) 1 -}}
{{- fail "worker.pageSize must be at least 1" -}}
{{- end -}}
{{- if lt (int64 .Values.worker.hostCacheBytes) -1 -}}
{{- fail (printf "worker.hostCacheBytes must be -1 (sized from the pod), 0 (off) or a byte count, got %d" (int64 .Values.worker.hostCacheBytes)) -}}
{{- end -}}
{{- range $c := list "router" "worker" -}}
{{- $v := index $.Values $c -}}
{{- if and $v.autoscaling.enabled $v.keda.enabled -}}
{{- fail (printf "%s.autoscaling.enabled and %s.keda.enabled exclude each other (KEDA makes its own HPA)" $c $c) -}}
{{- end -}}
{{- range $a := list $v.autoscaling $v.keda -}}
{{- if and $a.enabled (or (lt (int $a.minReplicas) 1) (lt (int $a.maxReplicas) (int $a.minReplicas))) -}}
{{- fail (printf "%s autoscaling: need 1 <= minReplicas <= maxReplicas, got %d and %d" $c (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- end -}}
{{- end -}}
{{- if and $v.autoscaling.enabled (eq (int $v.autoscaling.targetCPUUtilizationPercentage) 0) (empty $v.autoscaling.metrics) -}}
{{- fail (printf "%s.autoscaling: set targetCPUUtilizationPercentage or metrics" $c) -}}
{{- end -}}
{{- end -}}
{{- if and (or .Values.worker.autoscaling.enabled .Values.worker.keda.enabled) (ne .Values.router.workerDiscovery "dns") -}}
{{- fail "worker autoscaling needs router.workerDiscovery dns (a static list cannot follow the replica count)" -}}
{{- end -}}
{{- if and .Values.auth.enabled (eq .Values.auth.workerIdentity "certificate") -}}
{{- if not .Values.tls.enabled -}}
{{- fail "auth.workerIdentity certificate needs tls.enabled (the identity is the pods' TLS client certificate)" -}}
{{- end -}}
{{- $_ := required "auth.workerCertificateName (the TLS certificate's subject common name) is required with auth.workerIdentity certificate" .Values.auth.workerCertificateName -}}
{{- end -}}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) -}}
{{- $_ := required "tls.cert is required with tls.enabled and no tls.existingSecret" .Values.tls.cert -}}
{{- $_ := required "tls.key is required with tls.enabled and no tls.existingSecret" .Values.tls.key -}}
{{- $_ := required "tls.ca is required with tls.enabled and no tls.existingSecret" .Values.tls.ca -}}
{{- end -}}
{{- end -}}
