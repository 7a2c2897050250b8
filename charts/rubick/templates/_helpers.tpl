{{/* Names */}}
{{- define "rubick.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rubick.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Common labels; `component` is set by the caller with (dict "root" $ "component" "policy") */}}
{{- define "rubick.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "rubick.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: rubick
{{- end -}}

{{- define "rubick.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rubick.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "rubick.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespace the agents create the training pods in */}}
{{- define "rubick.jobsNamespace" -}}
{{- default .Release.Namespace .Values.jobs.namespace -}}
{{- end -}}

{{/* Where every component reaches NATS: nats.url, else the NATS chart's service (named as that chart names it) */}}
{{- define "rubick.natsUrl" -}}
{{- if .Values.nats.url -}}
{{- .Values.nats.url -}}
{{- else if .Values.nats.enabled -}}
{{- $name := "" -}}
{{- if .Values.nats.fullnameOverride -}}
{{- $name = .Values.nats.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains "nats" .Release.Name -}}
{{- $name = .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name = printf "%s-nats" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- printf "%s://%s:4222" (ternary "tls" "nats" (ne .Values.tls.secretName "")) $name -}}
{{- else -}}
{{- fail "nats.enabled is false: set nats.url to the NATS the components should use" -}}
{{- end -}}
{{- end -}}

{{- define "rubick.authSecret" -}}
{{- printf "%s-%s" .root.Values.auth.secretPrefix .identity -}}
{{- end -}}

{{- define "rubick.reporterSecret" -}}
{{- default (printf "%s-reporters" .Values.auth.secretPrefix) .Values.auth.reporterSecret -}}
{{- end -}}

{{- define "rubick.servicesServiceAccount" -}}
{{- printf "%s-services" (include "rubick.fullname" .) -}}
{{- end -}}

{{- define "rubick.agentServiceAccount" -}}
{{- printf "%s-agent" (include "rubick.fullname" .) -}}
{{- end -}}

{{/* Every pod: a non-root user, the runtime's default seccomp profile */}}
{{- define "rubick.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Every container: read-only root, no privilege escalation, no capabilities */}}
{{- define "rubick.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Environment every component shares: NATS, TLS CA, writable home and caches on the tmp emptyDir */}}
{{- define "rubick.commonEnv" -}}
- name: RUBICK_NATS_URL
  value: {{ include "rubick.natsUrl" . | quote }}
{{- if .Values.tls.caSecretName }}
- name: RUBICK_NATS_TLS_CA
  value: /var/run/rubick-tls/ca.crt
{{- end }}
- name: HOME
  value: /tmp
- name: XDG_CACHE_HOME
  value: /tmp/cache
- name: MPLCONFIGDIR
  value: /tmp/matplotlib
- name: PYTHONUNBUFFERED
  value: "1"
{{- end -}}

{{/* Seed of one identity at /var/run/rubick/creds.nk (with auth.enabled) */}}
{{- define "rubick.credsEnv" -}}
{{- if .root.Values.auth.enabled -}}
- name: RUBICK_NATS_CREDS
  value: /var/run/rubick/creds.nk
{{- end -}}
{{- end -}}

{{- define "rubick.credsMount" -}}
{{- if .root.Values.auth.enabled -}}
- name: creds
  mountPath: /var/run/rubick
  readOnly: true
{{- end -}}
{{- end -}}

{{- define "rubick.credsVolume" -}}
{{- if .root.Values.auth.enabled -}}
- name: creds
  secret:
    secretName: {{ include "rubick.authSecret" . }}
    defaultMode: 0440
    items:
      - key: {{ printf "%s.nk" .identity }}
        path: creds.nk
{{- end -}}
{{- end -}}

{{/* tmp (writable scratch) and the TLS CA */}}
{{- define "rubick.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.caSecretName }}
- name: tls-ca
  mountPath: /var/run/rubick-tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "rubick.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.tls.caSecretName }}
- name: tls-ca
  secret:
    secretName: {{ .Values.tls.caSecretName }}
    defaultMode: 0444
    items:
      - key: {{ .Values.tls.caKey }}
        path: ca.crt
{{- end }}
{{- end -}}

{{/* A consistency check: with tls.secretName the chart's NATS must serve that certificate */}}
{{- define "rubick.checks" -}}
{{- if and .Values.tls.secretName .Values.nats.enabled -}}
{{- $natsTls := dig "config" "nats" "tls" dict .Values.nats -}}
{{- if not (and (dig "enabled" false $natsTls) (eq (dig "secretName" "" $natsTls | toString) .Values.tls.secretName)) -}}
{{- fail (printf "tls.secretName is %q: also set nats.config.nats.tls.enabled=true and nats.config.nats.tls.secretName=%s so the chart's NATS serves that certificate" .Values.tls.secretName .Values.tls.secretName) -}}
{{- end -}}
{{- end -}}
{{- end -}}
