{{/* Names and labels. */}}
{{- define "pdserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pdserve.fullname" -}}
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

{{- define "pdserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pdserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pdserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "pdserve.selectorLabels" . }}
app.kubernetes.io/version: {{ include "pdserve.tag" . | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pdserve
{{- end -}}

{{/* Labels of one component: (dict "ctx" $ "component" "router"). */}}
{{- define "pdserve.componentLabels" -}}
{{ include "pdserve.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pdserve.componentSelector" -}}
{{ include "pdserve.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "pdserve.tag" -}}
{{- default (printf "%s-%s%s" .Chart.AppVersion .Values.image.variant (ternary "-vllm" "" (eq .Values.engine.name "vllm"))) .Values.image.tag -}}
{{- end -}}

{{- define "pdserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "pdserve.tag" .) -}}
{{- end -}}

{{- define "pdserve.serviceAccountName" -}}
{{- default (include "pdserve.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Where things are. */}}
{{- define "pdserve.directoryAddress" -}}
{{- printf "%s-directory:%d" (include "pdserve.fullname" .) (int .Values.directory.port) -}}
{{- end -}}

{{- define "pdserve.routerAddress" -}}
{{- printf "%s-router:%d" (include "pdserve.fullname" .) (int .Values.router.port) -}}
{{- end -}}

{{/* The router's HTTP front (router/http): its port's name, and the Secret of its API key
file ("" when no key is configured). */}}
{{- define "pdserve.httpPortName" -}}
{{- ternary "https" "http" .Values.security.enabled -}}
{{- end -}}

{{- define "pdserve.apiKeysSecret" -}}
{{- $k := .Values.router.http.apiKeys -}}
{{- if $k.existingSecret -}}
{{- $k.existingSecret -}}
{{- else if $k.keys -}}
{{- printf "%s-api-keys" (include "pdserve.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.caSecret" -}}
{{- default (printf "%s-ca" (include "pdserve.fullname" .)) .Values.security.ca.existingSecret -}}
{{- end -}}

{{/* cert-manager in use (for the CA when there is no existing one, and for the monitor
certificate)? "true"/"" */}}
{{- define "pdserve.certManager" -}}
{{- $cm := .Values.security.certManager.enabled -}}
{{- if .Values.security.enabled -}}
{{- if or (eq (toString $cm) "true") (and (eq (toString $cm) "auto") (.Capabilities.APIVersions.Has "cert-manager.io/v1")) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "pdserve.monitoring" -}}
{{- $sm := .Values.observability.serviceMonitor.enabled -}}
{{- if or (eq (toString $sm) "true") (and (eq (toString $sm) "auto") (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) -}}true{{- end -}}
{{- end -}}

{{- define "pdserve.redisSecret" -}}
{{- default (printf "%s-redis-auth" (include "pdserve.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{- define "pdserve.externalRedis" -}}
{{- if or .Values.redis.external.url .Values.redis.external.existingSecret -}}true{{- end -}}
{{- end -}}

{{/*
The pod's own certificate: init container pd-cert signs it with the CA Secret, which is
mounted into this container only (runtime/security/podcert.py). "hosts": more DNS names
(the router's Service names, which clients of its HTTPS front check).
(dict "ctx" $ "role" "decode" "name" "$(POD_NAME)" ["hosts" (list ...)])
*/}}
{{- define "pdserve.certInit" -}}
- name: pd-cert
  image: {{ include "pdserve.image" .ctx }}
  imagePullPolicy: {{ .ctx.Values.image.pullPolicy }}
  command: [python, -m, runtime.security.podcert, --ca-dir, /pd/ca, --out, /pd/tls,
            --role, {{ .role | quote }}, --name, {{ .name | quote }}, --host, "$(POD_IP)",
            {{- range .hosts }}
            --host, {{ . | quote }},
            {{- end }}
            --days, {{ .ctx.Values.security.certValidityDays | quote }}]
  env:
    {{- include "pdserve.podEnv" . | nindent 4 }}
  securityContext: {{- toYaml .ctx.Values.security.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 50m, memory: 64Mi}
    limits: {memory: 256Mi}
  volumeMounts:
    - {name: ca, mountPath: /pd/ca, readOnly: true}
    - {name: tls, mountPath: /pd/tls}
{{- end -}}

{{- define "pdserve.podEnv" -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: POD_IP
  valueFrom: {fieldRef: {fieldPath: status.podIP}}
{{- end -}}

{{/* Environment every pdserve server container gets: TLS, metrics, traces, logging. */}}
{{- define "pdserve.commonEnv" -}}
{{ include "pdserve.podEnv" . }}
- {name: PYTHONUNBUFFERED, value: "1"}
- {name: PD_LOG_LEVEL, value: {{ .ctx.Values.logLevel | quote }}}
{{- if .ctx.Values.security.enabled }}
- {name: PD_TLS_CERT, value: /pd/tls/tls.crt}
- {name: PD_TLS_KEY, value: /pd/tls/tls.key}
- {name: PD_TLS_CA, value: /pd/tls/ca.crt}
{{- else }}
- {name: PD_INSECURE, value: "1"}
{{- end }}
- {name: PD_METRICS_LISTEN, value: {{ printf "0.0.0.0:%d" (int .ctx.Values.observability.metrics.port) | quote }}}
{{- with .ctx.Values.observability.otlp }}
{{- if .endpoint }}
- {name: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, value: {{ .endpoint | quote }}}
- {name: OTEL_SERVICE_NAME, value: {{ printf "pdserve-%s" $.component | quote }}}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: "k8s.pod.name=$(POD_NAME),k8s.namespace.name=$(POD_NAMESPACE)"
{{- range $k, $v := .env }}
- {name: {{ $k }}, value: {{ $v | toString | quote }}}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* name: value pairs of a values map as env entries. */}}
{{- define "pdserve.extraEnv" -}}
{{- range $k, $v := . }}
- {name: {{ $k }}, value: {{ $v | toString | quote }}}
{{- end }}
{{- end -}}

{{/* Exec probes over mutual TLS (runtime/common/healthcheck.py): Kubernetes' grpc probe
cannot present a client certificate. (dict "port" 50080 "service" "router" "alive" false) */}}
{{- define "pdserve.probeCommand" -}}
exec:
  command: [python, -m, runtime.common.healthcheck, --address, {{ printf "127.0.0.1:%d" (int .port) | quote }},
            --service, {{ .service }}{{ if .alive }}, --alive{{ end }}]
{{- end -}}

{{/* startup (model load), readiness (SERVING: registered with a live lease), liveness
(any answer). (dict "port" .. "service" .. "startup" {periodSeconds, failureThreshold}
["ready" (dict "port" "https" "scheme" "HTTPS")]): with "ready", readiness is a GET of
/ready on that port instead (the router's HTTP front: it asks for no client certificate). */}}
{{- define "pdserve.probes" -}}
startupProbe:
  {{- include "pdserve.probeCommand" (dict "port" .port "service" .service "alive" true) | nindent 2 }}
  periodSeconds: {{ .startup.periodSeconds }}
  failureThreshold: {{ .startup.failureThreshold }}
  timeoutSeconds: 5
readinessProbe:
  {{- with .ready }}
  httpGet: {path: /ready, port: {{ .port }}, scheme: {{ .scheme }}}
  {{- else }}
  {{- include "pdserve.probeCommand" (dict "port" .port "service" .service) | nindent 2 }}
  {{- end }}
  periodSeconds: 5
  failureThreshold: 2
  successThreshold: 1
  timeoutSeconds: 5
livenessProbe:
  {{- include "pdserve.probeCommand" (dict "port" .port "service" .service "alive" true) | nindent 2 }}
  periodSeconds: 20
  failureThreshold: 6
  timeoutSeconds: 5
{{- end -}}

{{/* Volumes of the TLS files and the CA (only pd-cert mounts the CA). */}}
{{- define "pdserve.tlsVolumes" -}}
{{- if .Values.security.enabled }}
- name: tls
  emptyDir: {medium: Memory, sizeLimit: 1Mi}
- name: ca
  secret:
    secretName: {{ include "pdserve.caSecret" . }}
    defaultMode: 0400
    items:
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
{{- end }}
- name: tmp
  emptyDir: {sizeLimit: 1Gi}
{{- end -}}

{{- define "pdserve.modelVolume" -}}
{{- $m := .Values.model -}}
{{- if eq $m.source "pvc" }}
- name: model
  persistentVolumeClaim: {claimName: {{ $m.pvc.claimName }}, readOnly: true}
{{- else if eq $m.source "hostPath" }}
- name: model
  hostPath: {path: {{ $m.hostPath.path }}, type: Directory}
{{- else if eq $m.source "fetch" }}
- name: model
  emptyDir: {sizeLimit: {{ $m.fetch.sizeLimit }}}
{{- end }}
{{- end -}}

{{- define "pdserve.modelMount" -}}
{{- if ne .Values.model.source "preset" }}
- {name: model, mountPath: {{ .Values.model.mountPath }}, readOnly: true}
{{- end }}
{{- end -}}

{{- define "pdserve.modelEnv" -}}
{{- if eq .Values.model.source "preset" }}
- {name: PD_MODEL, value: {{ .Values.model.name | quote }}}
{{- else }}
- {name: PD_MODEL, value: {{ printf "%s/%s" .Values.model.mountPath .Values.model.name | quote }}}
{{- end }}
{{- end -}}

{{- define "pdserve.modelFetchInit" -}}
{{- if eq .Values.model.source "fetch" }}
- name: model-fetch
  image: {{ .Values.model.fetch.image }}
  command: {{- toYaml .Values.model.fetch.command | nindent 4 }}
  env:
    - {name: MODEL_DIR, value: {{ printf "%s/%s" .Values.model.mountPath .Values.model.name | quote }}}
  securityContext: {{- toYaml .Values.security.containerSecurityContext | nindent 4 }}
  resources:
    requests: {cpu: 500m, memory: 1Gi}
    limits: {memory: 4Gi}
  volumeMounts:
    - {name: model, mountPath: {{ .Values.model.mountPath }}}
    - {name: tmp, mountPath: /tmp}
{{- end }}
{{- end -}}

{{/* Pod-level fields every pdserve pod shares. */}}
{{- define "pdserve.podCommon" -}}
serviceAccountName: {{ include "pdserve.serviceAccountName" . }}
automountServiceAccountToken: false
enableServiceLinks: false
securityContext: {{- toYaml .Values.security.podSecurityContext | nindent 2 }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* nodeSelector, tolerations, affinity, topology spread of a component's values. */}}
{{- define "pdserve.placement" -}}
{{- with .nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints: {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A PodDisruptionBudget: (dict "ctx" $ "component" "decode" "pdb" .Values.decode.pdb) */}}
{{- define "pdserve.pdb" -}}
{{- if .pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "pdserve.fullname" .ctx }}-{{ .component }}
  labels: {{- include "pdserve.componentLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ .pdb.maxUnavailable }}
  selector:
    matchLabels: {{- include "pdserve.componentSelector" . | nindent 6 }}
{{- end }}
{{- end -}}
