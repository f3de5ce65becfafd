{{/* Names and labels. */}}

{{- define "embedjob-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "embedjob-operator.fullname" -}}
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

{{- define "embedjob-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embedjob-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "embedjob-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "embedjob-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: embedjob
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "embedjob-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "embedjob-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* RBAC objects live outside the release namespace (cluster-scoped, or in a watched namespace): their names carry the release namespace. */}}
{{- define "embedjob-operator.rbacName" -}}
{{- printf "%s-%s" .Release.Namespace (include "embedjob-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "embedjob-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "embedjob-operator.workerImage" -}}
{{- printf "%s:%s" .Values.worker.image.repository (default .Chart.AppVersion .Values.worker.image.tag) -}}
{{- end -}}

{{/* The pods' security: the operator and its uninstall hook run the same image the same way. */}}
{{- define "embedjob-operator.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "embedjob-operator.containerSecurityContext" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The pod policy's parameters (embedjob/pod_policy.py): the ConfigMap's data, which is the admission policy's
params and the operator's EMBEDJOB_POD_POLICY alike. Unset lists default to the worker image's repository and to
the ServiceAccounts podDefaults names. */}}
{{- define "embedjob-operator.podPolicyData" -}}
{{- $policy := .Values.podPolicy -}}
{{- $accounts := list -}}
{{- range $policy.allowedServiceAccounts }}{{ $accounts = append $accounts . }}{{ end -}}
{{- range (list .Values.podDefaults.head .Values.podDefaults.workers) }}
{{- with (dig "spec" "serviceAccountName" "" (. | default dict)) }}{{ $accounts = append $accounts . }}{{ end -}}
{{- end -}}
{{- $prefixes := $policy.allowedImagePrefixes | default (list .Values.worker.image.repository) -}}
{{- $data := dict "allowedImagePrefixes" (join "," $prefixes) "allowedServiceAccounts" (join "," (uniq $accounts)) -}}
{{- range $key, $value := $policy }}
{{- if and (hasPrefix "allow" $key) (kindIs "bool" $value) }}{{ $_ := set $data $key (toString $value) }}{{ end -}}
{{- end -}}
{{- toJson $data -}}
{{- end -}}

{{/* Cluster-scoped, so its name carries the release namespace. */}}
{{- define "embedjob-operator.podPolicyName" -}}
{{- printf "%s-pod-policy" (include "embedjob-operator.rbacName" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
