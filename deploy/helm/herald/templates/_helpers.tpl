{{/* Names and labels. */}}
{{- define "herald.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "herald.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "herald.selectorLabels" -}}
app.kubernetes.io/name: {{ include "herald.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "herald.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "herald.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Whether the pods read a herald.toml, and from which Secret. */}}
{{- define "herald.configSecret" -}}
{{- if .Values.config.existingSecret -}}
{{- .Values.config.existingSecret -}}
{{- else if .Values.config.toml -}}
{{- include "herald.fullname" . -}}
{{- end -}}
{{- end -}}

{{/* Whether the app comes from HERALD_APP_*, and from which Secret. */}}
{{- define "herald.appSecret" -}}
{{- if .Values.app.existingSecret -}}
{{- .Values.app.existingSecret -}}
{{- else if or .Values.app.id .Values.app.key .Values.app.secret -}}
{{- include "herald.fullname" . -}}
{{- end -}}
{{- end -}}

{{/*
The operator's own credentials, never the development app's: Herald would
serve its public development app (secret "app-secret") with none given, and
refuses to on a pod's address anyway.
*/}}
{{- define "herald.validate" -}}
{{- $v := .Values -}}
{{- if not (or $v.app.existingSecret $v.config.existingSecret $v.config.toml) -}}
{{- $_ := required "herald: app.id is required: give your own app's id, key and secret (--set app.id=...,app.key=...,app.secret=...), or app.existingSecret, or a herald.toml with [[apps]] in config.toml or config.existingSecret. There is no default app: Herald's development app is public." $v.app.id -}}
{{- $_ := required "herald: app.key is required (your own app's key; see app.id)" $v.app.key -}}
{{- $_ := required "herald: app.secret is required (your own app's secret, e.g. openssl rand -hex 32; see app.id)" $v.app.secret -}}
{{- end -}}
{{- if and (not $v.app.existingSecret) (or $v.app.id $v.app.key $v.app.secret) -}}
{{- if not (and $v.app.id $v.app.key $v.app.secret) -}}
{{- fail "herald: app.id, app.key and app.secret go together: give all three" -}}
{{- end -}}
{{- end -}}
{{- if eq (toString $v.app.secret) "app-secret" -}}
{{- fail "herald: app.secret is Herald's public development secret \"app-secret\": give your own" -}}
{{- end -}}
{{- if and $v.config.toml (regexMatch "secret\\s*=\\s*\"app-secret\"" $v.config.toml) -}}
{{- fail "herald: config.toml has an app with Herald's public development secret \"app-secret\": give your own" -}}
{{- end -}}
{{- if and $v.config.toml (not $v.config.existingSecret) (not (include "herald.appSecret" .)) (not (contains "[[apps]]" $v.config.toml)) -}}
{{- fail "herald: config.toml has no [[apps]] and app.* is empty: Herald would serve its public development app; add [[apps]] or set app.id, app.key and app.secret" -}}
{{- end -}}
{{- $pods := ternary $v.autoscaling.maxReplicas $v.replicaCount $v.autoscaling.enabled -}}
{{- $broker := or $v.broker.url $v.broker.existingSecret $v.config.existingSecret (and $v.config.toml (contains "[broker]" $v.config.toml)) -}}
{{- if and (gt (int $pods) 1) (not $broker) (not (eq (toString $v.broker.url) "local")) -}}
{{- fail "herald: more than one pod needs broker.url (the same Redis or NATS for every pod, docs/cluster.md): without one each pod is a separate server and a client sees only its own pod's events. broker.url=local runs them apart anyway." -}}
{{- end -}}
{{- if and $v.config.toml $v.config.existingSecret -}}
{{- fail "herald: config.toml and config.existingSecret: give one" -}}
{{- end -}}
{{- end -}}

{{- define "herald.terminationGrace" -}}
{{- if .Values.terminationGracePeriodSeconds -}}
{{- .Values.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add (int .Values.preStopSleepSeconds) (int .Values.shutdownGrace) 10 -}}
{{- end -}}
{{- end -}}
