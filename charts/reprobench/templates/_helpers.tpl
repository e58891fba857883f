{{/* Names and labels shared by every object of the release. */}}

{{- define "reprobench.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "reprobench.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "reprobench.selectorLabels" -}}
app.kubernetes.io/name: {{ include "reprobench.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "reprobench.labels" -}}
{{ include "reprobench.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "reprobench.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "reprobench.coordinator" -}}
{{- printf "%s-coordinator" (include "reprobench.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "reprobench.coordinatorUrl" -}}
{{- printf "%s://%s:%d" (ternary "https" "http" .Values.tls.enabled) (include "reprobench.coordinator" .) (int .Values.coordinator.port) -}}
{{- end -}}

{{/* The Secret with the coordinator's certificate (tls.crt, tls.key) and its CA (ca.crt). */}}
{{- define "reprobench.tlsSecret" -}}
{{- default (printf "%s-tls" (include "reprobench.fullname" .)) .Values.tls.existingSecret -}}
{{- end -}}

{{/* Where pods mount the CA (nodes, jobs) or the certificate (the coordinator). */}}
{{- define "reprobench.tlsDir" -}}
/var/run/reprobench/tls
{{- end -}}

{{/* Client flags for the CA: nodes and jobs verify the coordinator's certificate. */}}
{{- define "reprobench.tlsClientArgs" -}}
{{- if .Values.tls.enabled -}}
--tls-ca {{ include "reprobench.tlsDir" . }}/ca.crt
{{- end -}}
{{- end -}}

{{/* The CA volume of a client pod. */}}
{{- define "reprobench.tlsCaVolume" -}}
- name: tls-ca
  secret:
    secretName: {{ include "reprobench.tlsSecret" . }}
    defaultMode: 0444
    items:
      - key: ca.crt
        path: ca.crt
{{- end -}}

{{- define "reprobench.tokenSecret" -}}
{{- default (printf "%s-token" (include "reprobench.fullname" .)) .Values.token.existingSecret -}}
{{- end -}}

{{- define "reprobench.tokenKey" -}}
{{- if .Values.token.existingSecret -}}{{ .Values.token.key }}{{- else -}}token{{- end -}}
{{- end -}}

{{/* Where pods mount the join token. */}}
{{- define "reprobench.tokenFile" -}}
/var/run/reprobench/token/{{ include "reprobench.tokenKey" . }}
{{- end -}}

{{- define "reprobench.tokenVolume" -}}
- name: token
  secret:
    secretName: {{ include "reprobench.tokenSecret" . }}
    defaultMode: 0400
    items:
      - key: {{ include "reprobench.tokenKey" . }}
        path: {{ include "reprobench.tokenKey" . }}
{{- end -}}

{{/* A pool's Deployment name: (list $ poolName). */}}
{{- define "reprobench.poolName" -}}
{{- $ := index . 0 -}}
{{- printf "%s-node-%s" (include "reprobench.fullname" $) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Slots of one pod of a pool: the sum over its kinds. */}}
{{- define "reprobench.poolSlots" -}}
{{- $sum := 0 -}}
{{- range $kind, $n := .slots -}}{{- $sum = add $sum $n -}}{{- end -}}
{{- $sum -}}
{{- end -}}

{{/* A pool's node credential Secret: (list $ poolName). */}}
{{- define "reprobench.poolCredentialSecret" -}}
{{- $ := index . 0 -}}
{{- printf "%s-credential" (include "reprobench.poolName" (list $ (index . 1))) -}}
{{- end -}}

{{/* The nightly job's client credential Secret. */}}
{{- define "reprobench.clientCredentialSecret" -}}
{{- printf "%s-client-credential" (include "reprobench.fullname" .) -}}
{{- end -}}

{{/* Where a pod mounts the credential it presents (a pool's node credential, the client's). */}}
{{- define "reprobench.credentialFile" -}}
/var/run/reprobench/credential/token
{{- end -}}
