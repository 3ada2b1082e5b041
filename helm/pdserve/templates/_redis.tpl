{{/* The directory's Redis settings: PD_REDIS_URL (password from a Secret, expanded by the
kubelet, so it is in no manifest), and under HA the Sentinels it follows the master through. */}}
{{- define "pdserve.redisEnv" -}}
{{- $full := include "pdserve.fullname" . -}}
{{- if include "pdserve.externalRedis" . }}
{{- if .Values.redis.external.existingSecret }}
- name: PD_REDIS_URL
  valueFrom: {secretKeyRef: {name: {{ .Values.redis.external.existingSecret }}, key: url}}
{{- else }}
- {name: PD_REDIS_URL, value: {{ .Values.redis.external.url | quote }}}
{{- end }}
{{- else }}
{{- if .Values.redis.ha.enabled }}
{{- /* Under HA the master is whoever the Sentinels name (kv_directory/config.py refuses a
URL with a host beside PD_REDIS_SENTINELS): the password alone, from the Secret. */}}
- name: PD_REDIS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "pdserve.redisSecret" . }}, key: {{ .Values.redis.auth.secretKey }}}}
{{- $s := .Values.redis.ha.sentinel }}
- name: PD_REDIS_SENTINELS
  value: {{ include "pdserve.sentinelAddresses" . | quote }}
- {name: PD_REDIS_SENTINEL_MASTER, value: {{ $s.masterName | quote }}}
{{- else }}
- name: REDIS_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "pdserve.redisSecret" . }}, key: {{ .Values.redis.auth.secretKey }}}}
- {name: PD_REDIS_URL, value: {{ printf "redis://:$(REDIS_PASSWORD)@%s-redis:6379/0" $full | quote }}}
{{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.sentinelAddresses" -}}
{{- $full := include "pdserve.fullname" . -}}
{{- $s := .Values.redis.ha.sentinel -}}
{{- $out := list -}}
{{- range $i := until (int $s.replicas) -}}
{{- $out = append $out (printf "%s-sentinel-%d.%s-sentinel-headless:%d" $full $i $full (int $s.port)) -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* The Redis password Secret, kept across upgrades (lookup; a fresh one under helm template). */}}
{{- define "pdserve.redisAuthSecret" -}}
{{- if not .Values.redis.auth.existingSecret }}
{{- $name := include "pdserve.redisSecret" . }}
{{- $old := lookup "v1" "Secret" .Release.Namespace $name }}
apiVersion: v1
kind: Secret
metadata:
  name: {{ $name }}
  labels: {{- include "pdserve.componentLabels" (dict "ctx" . "component" "redis") | nindent 4 }}
  annotations:
    helm.sh/resource-policy: keep
type: Opaque
data:
  {{- if and $old $old.data (index $old.data .Values.redis.auth.secretKey) }}
  {{ .Values.redis.auth.secretKey }}: {{ index $old.data .Values.redis.auth.secretKey }}
  {{- else }}
  {{ .Values.redis.auth.secretKey }}: {{ randAlphaNum 32 | b64enc }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "pdserve.redisSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  runAsUser: 999
  runAsGroup: 999
  capabilities: {drop: [ALL]}
{{- end -}}

{{/* A redis-cli check with the password from the environment (REDISCLI_AUTH), never argv. */}}
{{- define "pdserve.redisProbe" -}}
exec:
  command: [sh, -c, {{ printf "redis-cli -h 127.0.0.1 -p %d ping | grep -q PONG" (int .port) | quote }}]
{{- end -}}
