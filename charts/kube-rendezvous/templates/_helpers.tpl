{{/* The chart's name, or nameOverride. */}}
{{- define "kube-rendezvous.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release-qualified name: <release>-<chart>, or the release name if it already holds the chart's. */}}
{{- define "kube-rendezvous.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* helm.sh/chart label value. */}}
{{- define "kube-rendezvous.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that identify this release's objects (never change them: selectors use them). */}}
{{- define "kube-rendezvous.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-rendezvous.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Standard labels of every object of the chart. */}}
{{- define "kube-rendezvous.labels" -}}
helm.sh/chart: {{ include "kube-rendezvous.chart" . }}
{{ include "kube-rendezvous.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kube-rendezvous
{{- end }}

{{/* The operator's pod selector. */}}
{{- define "kube-rendezvous.operatorSelectorLabels" -}}
{{ include "kube-rendezvous.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of the operator's objects. */}}
{{- define "kube-rendezvous.operatorLabels" -}}
{{ include "kube-rendezvous.labels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Labels of the training pods' RBAC objects. */}}
{{- define "kube-rendezvous.trainingLabels" -}}
{{ include "kube-rendezvous.labels" . }}
app.kubernetes.io/component: training-rbac
{{- end }}

{{/* The operator's Deployment, Roles and RoleBindings. */}}
{{- define "kube-rendezvous.operatorName" -}}
{{- printf "%s-operator" (include "kube-rendezvous.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* The metrics Service (a DNS label: at most 63 characters). */}}
{{- define "kube-rendezvous.metricsServiceName" -}}
{{- printf "%s-metrics" (include "kube-rendezvous.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The training pods' Role and RoleBinding. */}}
{{- define "kube-rendezvous.agentName" -}}
{{- printf "%s-agent" (include "kube-rendezvous.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/*
Prefix of cluster-scoped objects: release name and namespace both, so that two releases
(even of the same name, in two namespaces) never share a ClusterRole or ClusterRoleBinding.
*/}}
{{- define "kube-rendezvous.clusterPrefix" -}}
{{- printf "%s-%s" (include "kube-rendezvous.fullname" .) .Release.Namespace | trunc 200 | trimSuffix "-" }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "kube-rendezvous.serviceAccountName" -}}
{{- default (include "kube-rendezvous.operatorName" .) .Values.serviceAccount.name }}
{{- end }}

{{/* The operator image: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "kube-rendezvous.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
Namespaces the operator watches, as a JSON list (one --namespace each); [] means every namespace.
rbac.scope=namespace without watchNamespaces watches the release namespace.
*/}}
{{- define "kube-rendezvous.watchNamespaces" -}}
{{- if .Values.watchNamespaces }}
{{- toJson (uniq .Values.watchNamespaces) }}
{{- else if eq .Values.rbac.scope "namespace" }}
{{- toJson (list .Release.Namespace) }}
{{- else }}
{{- toJson list }}
{{- end }}
{{- end }}

{{/* Namespaces that get the training pods' ServiceAccount, Role and RoleBinding, as a JSON list. */}}
{{- define "kube-rendezvous.trainingNamespaces" -}}
{{- if .Values.trainingRBAC.namespaces }}
{{- toJson (uniq .Values.trainingRBAC.namespaces) }}
{{- else }}
{{- toJson (list .Release.Namespace) }}
{{- end }}
{{- end }}

{{/* The operator's rules inside one namespace (docs/operator-rbac.yaml minus the cluster-wide ones). */}}
{{- define "kube-rendezvous.operatorNamespacedRules" -}}
# Watch Rendezvous objects; patch for Kopf's rare bookkeeping and to remove earlier releases' finalizer; delete after a TTL.
- apiGroups: [kube-rendezvous.io]
  resources: [rendezvouses]
  verbs: [get, list, watch, patch, delete]
# Conditions, observedGeneration and evictedNodes.
- apiGroups: [kube-rendezvous.io]
  resources: [rendezvouses/status]
  verbs: [get, patch]
# Node and writer Leases: the operator is the preferred writer (it holds the writer Lease,
# folds the nodes' requests and judges heartbeat expiry by watching the node Leases).
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, list, watch, create, update, patch, delete]
# Training pods, to evict the nodes of pods that are gone.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
# Events for users: round completed, node joined/left/evicted, closed, state corrupt. list: a
# new leader (after a failover or restart) reads what was announced, so it never repeats it.
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch, list]
{{- if include "kube-rendezvous.failsLostPods" . }}
# Mark the training pods of a lost Node Failed (DisruptionTarget) so their Job replaces them, then delete
# them so their tokens stop working (operator.lostNodes.failPodsAfterSeconds; docs/operator-rbac-lost-nodes.yaml).
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [delete]
{{- end }}
{{- end }}

{{/* "true" when the operator marks a lost Node's pods Failed (operator.lostNodes.failPodsAfterSeconds set, 0 too). */}}
{{- define "kube-rendezvous.failsLostPods" -}}
{{- $lost := .Values.operator.lostNodes | default dict }}
{{- if not (kindIs "invalid" $lost.failPodsAfterSeconds) }}true{{ end }}
{{- end }}

{{/* The operator's cluster-wide read of CustomResourceDefinitions. */}}
{{- define "kube-rendezvous.operatorCrdRules" -}}
# Kopf discovers its resources through the CustomResourceDefinitions.
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [get, list, watch]
{{- end }}

{{/* The operator's read of Kubernetes Nodes: cluster-scoped, so a ClusterRole in either scope. */}}
{{- define "kube-rendezvous.operatorNodeRules" -}}
# Kubernetes Nodes (cluster-scoped), to evict the nodes of training pods on a NotReady one.
# Without it the operator logs one warning and evicts them only when their heartbeats expire.
- apiGroups: [""]
  resources: [nodes]
  verbs: [get, list, watch]
{{- end }}

{{/* The metadata: line of a CRD with the chart's labels and, with crds.keep, the keep policy. */}}
{{- define "kube-rendezvous.crdMetadata" -}}
metadata:
  labels:
    {{- include "kube-rendezvous.labels" . | nindent 4 }}
    app.kubernetes.io/component: crds
  {{- if .Values.crds.keep }}
  annotations:
    # Never deleted by helm uninstall or upgrade: deleting a CRD deletes every object of it.
    helm.sh/resource-policy: keep
  {{- end }}
{{ end }}

{{/*
A securityContext from values (the dict given as "context"): runAsNonRoot always true and, with
openshift, no runAsUser, runAsGroup or fsGroup (the platform assigns them). Called with
(dict "root" $ "context" .Values.operator.securityContext).
*/}}
{{- define "kube-rendezvous.securityContext" -}}
{{- $context := deepCopy (.context | default dict) }}
{{- $_ := set $context "runAsNonRoot" true }}
{{- if .root.Values.openshift }}
{{- $context = omit $context "runAsUser" "runAsGroup" "fsGroup" }}
{{- end }}
{{- toYaml $context }}
{{- end }}

{{/* The operator pods' labels: operator.podLabels under the chart's own (which win: the Deployment selects by them). */}}
{{- define "kube-rendezvous.operatorPodLabels" -}}
{{- toYaml (merge (include "kube-rendezvous.operatorLabels" . | fromYaml) (deepCopy .Values.operator.podLabels)) }}
{{- end }}

{{/* Namespaces the release creates (trainingRBAC.createNamespaces): the training namespaces but the release's, as a JSON list. */}}
{{- define "kube-rendezvous.createdNamespaces" -}}
{{- if and .Values.trainingRBAC.enabled .Values.trainingRBAC.createNamespaces }}
{{- toJson (without (include "kube-rendezvous.trainingNamespaces" . | fromJsonArray) .Release.Namespace) }}
{{- else }}
{{- toJson list }}
{{- end }}
{{- end }}
