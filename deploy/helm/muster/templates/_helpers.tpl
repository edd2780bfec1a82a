{{/* The chart's name. */}}
{{- define "muster.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name: the release, or release-chart. Kept short enough for
the per-pod DNS names of the StatefulSet (name-N.name-peers). */}}
{{- define "muster.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The headless Service that gives each replica a stable name. */}}
{{- define "muster.peersService" -}}
{{- printf "%s-peers" (include "muster.fullname" .) }}
{{- end }}

{{- define "muster.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "muster.selectorLabels" -}}
app.kubernetes.io/name: {{ include "muster.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "muster.labels" -}}
helm.sh/chart: {{ include "muster.chart" . }}
{{ include "muster.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "muster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "muster.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* An image reference: repository, then @digest when given, else :tag. */}}
{{- define "muster.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .default .image.tag) }}
{{- end }}
{{- end }}

{{- define "muster.scheme" -}}
{{- if .Values.tls.enabled }}https{{ else }}http{{ end }}
{{- end }}

{{/* The signing key's Secret (the operator's: the chart takes no key). */}}
{{- define "muster.signingKeySecret" -}}
{{- .Values.signingKey.existingSecret }}
{{- end }}

{{/* MUSTER_PEERS: every replica's stable base URL (the pod's own included:
its relay to itself carries nothing, see README.md). */}}
{{- define "muster.peers" -}}
{{- $full := include "muster.fullname" . }}
{{- $svc := include "muster.peersService" . }}
{{- $scheme := include "muster.scheme" . }}
{{- $peers := list }}
{{- range $i := until (int .Values.replicaCount) }}
{{- $peers = append $peers (printf "%s://%s-%d.%s.%s.svc.%s:%d" $scheme $full $i $svc $.Release.Namespace $.Values.clusterDomain (int $.Values.ports.api)) }}
{{- end }}
{{- join "," $peers }}
{{- end }}

{{/* Checks across values that the schema cannot express; each failure says
what to set. */}}
{{- define "muster.validate" -}}
{{- if not .Values.issuers }}
{{- fail "muster: set issuers, the OIDC issuer URLs whose tokens muster accepts (MUSTER_ISSUERS)" }}
{{- end }}
{{- if .Values.signingKey.privateKey }}
{{- fail "muster: signingKey.privateKey is no longer taken: Helm keeps values in its release record, readable by whoever reads the release. Create the key's Secret and set signingKey.existingSecret: openssl genpkey -algorithm ed25519 -out signing.key && kubectl -n NAMESPACE create secret generic muster-signing-key --from-file=signing.key (docs/keys.md)" }}
{{- end }}
{{- if and (not .Values.signingKey.existingSecret) (not .Values.signingKey.file) }}
{{- fail "muster: set signingKey.existingSecret, a Secret holding the region's signing key (openssl genpkey -algorithm ed25519 -out signing.key && kubectl -n NAMESPACE create secret generic muster-signing-key --from-file=signing.key), or signingKey.file in a CSI secret store's mount: the replicas authenticate each other with it (docs/keys.md)" }}
{{- end }}
{{- if and .Values.signingKey.existingSecret .Values.signingKey.file }}
{{- fail "muster: set signingKey.existingSecret or signingKey.file, not both" }}
{{- end }}
{{- with .Values.signingKey.file }}
{{- $keyFile := . }}
{{- $in := false }}
{{- range $.Values.extraVolumeMounts }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $keyFile }}{{ $in = true }}{{ end }}
{{- end }}
{{- if not $in }}
{{- fail (printf "muster: signingKey.file %q is in none of extraVolumeMounts: mount the CSI secret store holding it there" $keyFile) }}
{{- end }}
{{- end }}
{{- $dbSources := 0 }}
{{- range list .Values.database.existingSecret .Values.database.url .Values.database.urlFile }}{{ if . }}{{ $dbSources = add1 $dbSources }}{{ end }}{{ end }}
{{- if eq $dbSources 0 }}
{{- fail "muster: set database.existingSecret, a Secret holding DATABASE_URL (or database.url, for a URL without a password, or database.urlFile, a file in extraVolumeMounts holding it)" }}
{{- end }}
{{- if gt $dbSources 1 }}
{{- fail "muster: set one of database.existingSecret, database.url and database.urlFile" }}
{{- end }}
{{- $urlFile := .Values.database.urlFile }}
{{- if $urlFile }}
{{- $in := false }}
{{- range .Values.extraVolumeMounts }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $urlFile }}{{ $in = true }}{{ end }}
{{- end }}
{{- if not $in }}
{{- fail (printf "muster: database.urlFile %q is in none of extraVolumeMounts: mount the volume holding it (a CSI secret store, a Secret) there" $urlFile) }}
{{- end }}
{{- end }}
{{- if and .Values.database.iam.enabled .Values.database.urlFile }}
{{- fail "muster: with database.iam.enabled give database.url (no password) rather than a file: IAM mode takes no password" }}
{{- end }}
{{- if and .Values.database.url (regexMatch "^[a-zA-Z][a-zA-Z0-9+.-]*://[^/@]*:[^/@]*@" .Values.database.url) }}
{{- fail "muster: database.url carries a password; put the URL in a Secret (database.existingSecret), or use Aurora IAM (database.iam.enabled) with a URL without one" }}
{{- end }}
{{- if and .Values.database.url (regexMatch "(?i)[?&]password=" .Values.database.url) }}
{{- fail "muster: database.url carries a password parameter; put the URL in a Secret (database.existingSecret)" }}
{{- end }}
{{- if and .Values.database.iam.enabled (not .Values.database.iam.region) }}
{{- fail "muster: database.iam.enabled needs database.iam.region (MUSTER_DB_IAM_REGION)" }}
{{- end }}
{{- if and .Values.database.iam.enabled .Values.database.existingSecret }}
{{- fail "muster: with database.iam.enabled give database.url (no password) rather than a Secret: IAM mode takes no password" }}
{{- end }}
{{- if and .Values.database.iam.enabled .Values.database.url (regexMatch "(?i)[?&]sslmode=" .Values.database.url) (not (regexMatch "(?i)[?&]sslmode=verify-full(&|$)" .Values.database.url)) }}
{{- fail "muster: with database.iam.enabled, database.url's sslmode must be verify-full (or left out: the chart sets PGSSLMODE=verify-full); require and verify-ca do not check the server's name, and the IAM token would go to whoever answers" }}
{{- end }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.tls.enabled) (not .Values.tls.allowPlainPeers) }}
{{- fail (printf "muster: %d replicas need TLS between them: set tls.enabled with tls.existingSecret (a kubernetes.io/tls Secret whose certificate names *.%s.%s.svc.%s, e.g. from cert-manager) and tls.ca.existingSecret (the CA the replicas verify each other with); replicas refuse to follow a peer advertising plain http. For a lab only, tls.allowPlainPeers=true keeps them on http (MUSTER_PEER_ALLOW_HTTP), readable and rewritable by anyone on the pod network" (int .Values.replicaCount) (include "muster.peersService" .) .Release.Namespace .Values.clusterDomain) }}
{{- end }}
{{- if and .Values.tls.enabled .Values.tls.allowPlainPeers }}
{{- fail "muster: tls.allowPlainPeers is for replicas without TLS; with tls.enabled leave it false" }}
{{- end }}
{{- if and .Values.tls.enabled (gt (int .Values.replicaCount) 1) (not .Values.tls.ca.existingSecret) }}
{{- fail (printf "muster: with tls.enabled and %d replicas, set tls.ca.existingSecret (and tls.ca.key): the CA the replicas verify each other's certificates with (MUSTER_TLS_CA); a certificate for *.%s.%s.svc.%s comes from a private CA, which the system roots do not hold (with cert-manager: the certificate's own Secret, key ca.crt)" (int .Values.replicaCount) (include "muster.peersService" .) .Release.Namespace .Values.clusterDomain) }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.existingSecret) }}
{{- fail "muster: tls.enabled needs tls.existingSecret, a Secret of type kubernetes.io/tls" }}
{{- end }}
{{- if and .Values.tls.clientCA.existingSecret (not .Values.tls.enabled) }}
{{- fail "muster: tls.clientCA (mutual TLS) needs tls.enabled" }}
{{- end }}
{{- if and .Values.tls.ca.existingSecret (not .Values.tls.enabled) }}
{{- fail "muster: tls.ca needs tls.enabled" }}
{{- end }}
{{- if and .Values.reconcile.enabled (not .Values.reconcile.config) }}
{{- fail "muster: reconcile.enabled needs reconcile.config, the reconcile file (docs/reconciliation.md)" }}
{{- end }}
{{- $ports := dict }}
{{- $listeners := dict "api" .Values.ports.api }}
{{- if .Values.xds.enabled }}{{ $_ := set $listeners "xds" .Values.ports.xds }}{{ end }}
{{- if .Values.metrics.enabled }}{{ $_ := set $listeners "metrics" .Values.ports.metrics }}{{ end }}
{{- range $name := keys $listeners | sortAlpha }}
{{- $p := toString (index $listeners $name) }}
{{- if hasKey $ports $p }}
{{- fail (printf "muster: ports.%s and ports.%s are both %s: each listener needs its own port" (index $ports $p) $name $p) }}
{{- end }}
{{- $_ := set $ports $p $name }}
{{- end }}
{{- range .Values.proxyProtocol.from }}
{{- /* The schema checks the form; an IPv4 network must also have no host
bits set, as muster refuses one at start (did you mean the network?). */}}
{{- if and (contains "/" .) (not (contains ":" .)) }}
{{- $parts := splitList "/" . }}
{{- $o := splitList "." (first $parts) }}
{{- $addr := add (mul (atoi (index $o 0)) 16777216) (mul (atoi (index $o 1)) 65536) (mul (atoi (index $o 2)) 256) (atoi (index $o 3)) }}
{{- $block := 1 }}
{{- range until (sub 32 (atoi (last $parts)) | int) }}{{ $block = mul $block 2 }}{{ end }}
{{- if ne (mod $addr $block) 0 }}
{{- fail (printf "muster: proxyProtocol.from %q has host bits set below its /%s: give the network's first address (muster refuses it at start)" . (last $parts)) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and .Values.serviceAccount.roleArn (not .Values.serviceAccount.create) }}
{{- fail "muster: serviceAccount.roleArn is an annotation on the ServiceAccount this chart creates; with serviceAccount.create=false annotate your own ServiceAccount (eks.amazonaws.com/role-arn) and leave roleArn empty" }}
{{- end }}
{{- $own := include "muster.envNames" . | splitList "," }}
{{- $seenEnv := list }}
{{- range .Values.extraEnv }}
{{- if has .name $own }}
{{- fail (printf "muster: extraEnv sets %s, which the chart sets itself: set it through the chart's value (README.md, Values), or the pod would hold two values for it" .name) }}
{{- end }}
{{- if has .name $seenEnv }}
{{- fail (printf "muster: extraEnv sets %s twice" .name) }}
{{- end }}
{{- $seenEnv = append $seenEnv .name }}
{{- end }}
{{- /* The chart's own volumes and mount paths (statefulset.yaml): an
extra one by the same name or at, or inside, the same path would shadow
it. Keep these lists with statefulset.yaml (TestChartOwnNamesGuarded). */}}
{{- $volumes := list "tmp" "signing-key" "public-keys" "reconcile" "rds-ca" "tls" "tls-ca" "tls-client-ca" }}
{{- $extra := list }}
{{- range .Values.extraVolumes }}
{{- if or (has .name $volumes) (has .name $extra) }}
{{- fail (printf "muster: extraVolumes names %q twice, or a volume of the chart's own (%s)" .name (join ", " $volumes)) }}
{{- end }}
{{- $extra = append $extra .name }}
{{- end }}
{{- $paths := list "/tmp" "/var/run/muster/signing-key" "/etc/muster/public-keys" "/etc/muster/reconcile" "/etc/muster/rds-ca" "/etc/muster/tls" "/etc/muster/tls-ca" "/etc/muster/tls-client-ca" }}
{{- range .Values.extraVolumeMounts }}
{{- if not (has .name $extra) }}
{{- fail (printf "muster: extraVolumeMounts mounts %q, which is not in extraVolumes" .name) }}
{{- end }}
{{- $at := trimSuffix "/" .mountPath }}
{{- range $paths }}
{{- if or (eq $at .) (hasPrefix (printf "%s/" .) $at) }}
{{- if eq . "/var/run/muster/signing-key" }}
{{- fail (printf "muster: extraVolumeMounts mounts %q over the signing key's Secret (%s): mount a CSI secret store elsewhere and give the key's path there as signingKey.file (README.md, Extra volumes)" $at .) }}
{{- end }}
{{- fail (printf "muster: extraVolumeMounts mounts %q inside the chart's own mount %s: choose another path" $at .) }}
{{- end }}
{{- end }}
{{- end }}
{{- if lt (int .Values.terminationGracePeriodSeconds) (add (int .Values.preStopSleepSeconds) 45 | int) }}
{{- fail (printf "muster: terminationGracePeriodSeconds (%d) must be at least preStopSleepSeconds (%d) + 45: muster needs 45 s to drain after SIGTERM (docs/replicas.md, Rolling restart)" (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds)) }}
{{- end }}
{{- end }}

{{/* The environment variables the container gets from the chart itself
(extraEnv may not set them again), comma-separated; GOMEMLIMIT only when the
chart computes it. */}}
{{- define "muster.envNames" -}}
{{- $n := list "POD_IP" "POD_NAME" "MUSTER_REPLICA" "MUSTER_PEERS" "MUSTER_ADVERTISE_URL" "MUSTER_REGION" "MUSTER_ISSUERS" "MUSTER_AUDIENCE" "MUSTER_LOG_LEVEL" "DATABASE_URL" "DATABASE_URL_FILE" "MUSTER_AUDIT_SIGNING_KEY_FILE" "MUSTER_AUDIT_PUBLIC_KEY_FILES" "MUSTER_XDS_ADDR" "MUSTER_METRICS_ADDR" "MUSTER_TLS_CERT" "MUSTER_TLS_KEY" "MUSTER_TLS_CA" "MUSTER_TLS_CLIENT_CA" "MUSTER_PEER_ALLOW_HTTP" "MUSTER_PROXY_PROTOCOL_FROM" "MUSTER_MIGRATE" }}
{{- if include "muster.csi" . }}
{{- $n = append $n "MUSTER_SECRET_FILES_ALLOW_SHARED" }}
{{- end }}
{{- if .Values.database.iam.enabled }}
{{- $n = concat $n (list "MUSTER_DB_IAM" "MUSTER_DB_IAM_REGION" "PGSSLMODE") }}
{{- if .Values.database.iam.caBundle.configMap }}
{{- $n = append $n "PGSSLROOTCERT" }}
{{- end }}
{{- end }}
{{- if include "muster.goMemLimit" . }}
{{- $n = append $n "GOMEMLIMIT" }}
{{- end }}
{{- join "," $n }}
{{- end }}

{{/* GOMEMLIMIT in bytes: goMemLimitPercent of resources.limits.memory (a
Kubernetes quantity: a number with an optional binary or decimal suffix);
empty without a memory limit or with a percentage of 0. */}}
{{- define "muster.goMemLimit" -}}
{{- $limit := "" }}
{{- /* A bare number of bytes comes from YAML as a float: print it whole. */}}
{{- with .Values.resources }}{{ with .limits }}{{ with .memory }}{{ $limit = ternary (printf "%.0f" .) (toString .) (kindIs "float64" .) }}{{ end }}{{ end }}{{ end }}
{{- $pct := int .Values.goMemLimitPercent }}
{{- if and $limit (gt $pct 0) }}
{{- $m := regexFindAll `^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$` $limit 1 }}
{{- if not $m }}
{{- fail (printf "muster: resources.limits.memory %q: give bytes or a quantity with Ki, Mi, Gi, Ti, k, M, G or T (e.g. 2Gi), from which GOMEMLIMIT is computed (or set goMemLimitPercent: 0)" $limit) }}
{{- end }}
{{- $num := regexReplaceAll "[a-zA-Z]+$" $limit "" }}
{{- $unit := regexReplaceAll "^[0-9.]+" $limit "" }}
{{- $mult := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) $unit }}
{{- divf (mulf $num $mult $pct) 100 | floor | int64 }}
{{- end }}
{{- end }}
