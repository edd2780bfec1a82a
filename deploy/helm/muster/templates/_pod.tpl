{{/* What the replicas' pods and the migrations Job share, so the Job
reaches the database exactly as the replicas do (same environment, files
and security settings) and the two cannot drift apart. */}}

{{/* The muster container's environment. */}}
{{- define "muster.podEnv" -}}
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
# The census name: the StatefulSet pod name, stable across restarts.
- name: MUSTER_REPLICA
  value: $(POD_NAME)
- name: MUSTER_PEERS
  value: {{ include "muster.peers" . | quote }}
- name: MUSTER_ADVERTISE_URL
  value: {{ printf "%s://$(POD_NAME).%s.%s.svc.%s:%d" (include "muster.scheme" .) (include "muster.peersService" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.api) | quote }}
- name: MUSTER_REGION
  value: {{ .Values.region | quote }}
- name: MUSTER_ISSUERS
  value: {{ join "," .Values.issuers | quote }}
- name: MUSTER_AUDIENCE
  value: {{ .Values.audience | quote }}
- name: MUSTER_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.database.existingSecret }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.existingSecret }}
      key: {{ .Values.database.secretKey }}
{{- else if .Values.database.urlFile }}
- name: DATABASE_URL_FILE
  value: {{ .Values.database.urlFile | quote }}
{{- else }}
- name: DATABASE_URL
  value: {{ .Values.database.url | quote }}
{{- end }}
{{- if .Values.database.iam.enabled }}
- name: MUSTER_DB_IAM
  value: "1"
- name: MUSTER_DB_IAM_REGION
  value: {{ .Values.database.iam.region | quote }}
# The IAM token goes only to a server whose certificate and
# name are verified: against the RDS CA bundle built into
# muster, or the one mounted from caBundle.configMap
# (DATABASE_URL's own sslmode and sslrootcert win over these).
- name: PGSSLMODE
  value: verify-full
{{- if .Values.database.iam.caBundle.configMap }}
- name: PGSSLROOTCERT
  value: /etc/muster/rds-ca/{{ .Values.database.iam.caBundle.key }}
{{- end }}
{{- end }}
- name: MUSTER_AUDIT_SIGNING_KEY_FILE
  value: {{ .Values.signingKey.file | default "/var/run/muster/signing-key/signing.key" | quote }}
{{- with .Values.signingKey.publicKeys.keys }}
- name: MUSTER_AUDIT_PUBLIC_KEY_FILES
  value: {{ $list := list }}{{ range . }}{{ $list = append $list (printf "/etc/muster/public-keys/%s" .) }}{{ end }}{{ join "," $list | quote }}
{{- end }}
{{- if .Values.xds.enabled }}
- name: MUSTER_XDS_ADDR
  value: ":{{ .Values.ports.xds }}"
{{- end }}
{{- if .Values.metrics.enabled }}
# On the pod's address: a bare port would be loopback only.
- name: MUSTER_METRICS_ADDR
  value: "[$(POD_IP)]:{{ .Values.ports.metrics }}"
{{- end }}
{{- if .Values.tls.enabled }}
- name: MUSTER_TLS_CERT
  value: /etc/muster/tls/tls.crt
- name: MUSTER_TLS_KEY
  value: /etc/muster/tls/tls.key
{{- if .Values.tls.ca.existingSecret }}
- name: MUSTER_TLS_CA
  value: /etc/muster/tls-ca/{{ .Values.tls.ca.key }}
{{- end }}
{{- if .Values.tls.clientCA.existingSecret }}
- name: MUSTER_TLS_CLIENT_CA
  value: /etc/muster/tls-client-ca/{{ .Values.tls.clientCA.key }}
{{- end }}
{{- end }}
{{- if or .Values.tls.allowPlainPeers (and (not .Values.tls.enabled) (eq (int .Values.replicaCount) 1)) }}
# A lab without TLS: the replicas follow each other over http.
# One replica without TLS has no peer to follow, but it still
# advertises its address, which muster refuses over plain http
# off loopback unless told.
- name: MUSTER_PEER_ALLOW_HTTP
  value: "true"
{{- end }}
{{- with .Values.proxyProtocol.from }}
- name: MUSTER_PROXY_PROTOCOL_FROM
  value: {{ join "," . | quote }}
{{- end }}
{{- if .Values.migrations.job.enabled }}
# The migrations Job applies the migrations before each rollout; a
# replica only checks the schema, and refuses to start (and is
# restarted) while it is behind this release or dirty.
- name: MUSTER_MIGRATE
  value: skip
{{- end }}
{{- if include "muster.csi" . }}
# A CSI secret store's files are 0644 on a read-only volume: muster
# accepts a key file others may read only there, and only when told.
- name: MUSTER_SECRET_FILES_ALLOW_SHARED
  value: "true"
{{- end }}
{{- with include "muster.goMemLimit" . }}
# A share of the memory limit (goMemLimitPercent): the runtime
# collects harder near it rather than the pod being OOM-killed.
- name: GOMEMLIMIT
  value: {{ . | quote }}
{{- end }}
{{- with .Values.extraEnv }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}

{{/* The muster container's mounts: (dict "root" . "job" BOOL). The Job
runs before the release's own objects exist (a Helm pre-install hook), so
it leaves out the reconcile file, a ConfigMap of the release that
migrations do not read. */}}
{{- define "muster.volumeMounts" -}}
{{- $job := .job }}
{{- with .root }}
- name: tmp
  mountPath: /tmp
{{- if not .Values.signingKey.file }}
- name: signing-key
  mountPath: /var/run/muster/signing-key
  readOnly: true
{{- end }}
{{- if .Values.signingKey.publicKeys.keys }}
- name: public-keys
  mountPath: /etc/muster/public-keys
  readOnly: true
{{- end }}
{{- if and .Values.reconcile.enabled (not $job) }}
- name: reconcile
  mountPath: /etc/muster/reconcile
  readOnly: true
{{- end }}
{{- if and .Values.database.iam.enabled .Values.database.iam.caBundle.configMap }}
- name: rds-ca
  mountPath: /etc/muster/rds-ca
  readOnly: true
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/muster/tls
  readOnly: true
{{- if .Values.tls.ca.existingSecret }}
- name: tls-ca
  mountPath: /etc/muster/tls-ca
  readOnly: true
{{- end }}
{{- if .Values.tls.clientCA.existingSecret }}
- name: tls-client-ca
  mountPath: /etc/muster/tls-client-ca
  readOnly: true
{{- end }}
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
{{- end }}

{{/* The pod's volumes: (dict "root" . "job" BOOL), as muster.volumeMounts. */}}
{{- define "muster.volumes" -}}
{{- $job := .job }}
{{- with .root }}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
# Owned by root, group the pod's fsGroup (65532), mode 0440:
# muster reads a key its group may read only when that group is
# its own (docs/keys.md).
{{- if not .Values.signingKey.file }}
- name: signing-key
  secret:
    secretName: {{ include "muster.signingKeySecret" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.signingKey.secretKey }}
        path: signing.key
{{- end }}
{{- if .Values.signingKey.publicKeys.keys }}
- name: public-keys
  secret:
    secretName: {{ required "signingKey.publicKeys.existingSecret names the Secret holding signingKey.publicKeys.keys" .Values.signingKey.publicKeys.existingSecret }}
    defaultMode: 0444
{{- end }}
{{- if and .Values.reconcile.enabled (not $job) }}
- name: reconcile
  configMap:
    name: {{ include "muster.fullname" . }}-reconcile
{{- end }}
{{- if and .Values.database.iam.enabled .Values.database.iam.caBundle.configMap }}
- name: rds-ca
  configMap:
    name: {{ .Values.database.iam.caBundle.configMap }}
    defaultMode: 0444
    items:
      - key: {{ .Values.database.iam.caBundle.key }}
        path: {{ .Values.database.iam.caBundle.key }}
{{- end }}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.existingSecret }}
    defaultMode: 0440
    items:
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
{{- if .Values.tls.ca.existingSecret }}
- name: tls-ca
  secret:
    secretName: {{ .Values.tls.ca.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.tls.ca.key }}
        path: {{ .Values.tls.ca.key }}
{{- end }}
{{- if .Values.tls.clientCA.existingSecret }}
- name: tls-client-ca
  secret:
    secretName: {{ .Values.tls.clientCA.existingSecret }}
    defaultMode: 0444
    items:
      - key: {{ .Values.tls.clientCA.key }}
        path: {{ .Values.tls.clientCA.key }}
{{- end }}
{{- end }}
{{- with .Values.extraVolumes }}
{{- toYaml . | nindent 0 }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when extraVolumes holds a CSI volume (a secret store). */}}
{{- define "muster.csi" -}}
{{- range .Values.extraVolumes }}{{ if hasKey . "csi" }}true{{ break }}{{ end }}{{ end }}
{{- end }}

{{/* The pod's securityContext. */}}
{{- define "muster.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
# Secret files are group-readable by 65532 (the key copy reads the
# signing key, muster the TLS files).
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The muster container's securityContext. */}}
{{- define "muster.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}
