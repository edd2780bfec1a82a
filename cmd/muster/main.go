// Command muster is the discovery and health-eligibility control plane.
//
//	muster dev     [--addr 127.0.0.1:8080] [--data ./.muster]   local cluster, built-in issuer
//	muster serve   [--addr :8080]                                production: DATABASE_URL, MUSTER_ISSUERS
//	muster migrate up|down|version|status [--data DIR]
//	muster migrate force VERSION [--data DIR]
//	muster token   --data DIR --kind K [--service S] [--subject X] [--team T] [--role R] [--address IP]... [--ttl D]
//	muster audit verify [--data DIR] [--checkpoints SINK] [--key FILE] [--export FILE]
//	muster audit export --since TIME [--until TIME] [--checkpoints SINK] [--out FILE]
//	muster seal status [--data DIR]                              live rows per sealing key
//	muster seal rotate [--data DIR] [--batch N]                  re-seal live rows under the signing key
//	muster breakglass --operator NAME --reason TEXT [--ttl 1h]   an audited, expiring operator token (docs/identity.md)
//	muster breakglass revoke ID | list
//	muster tgsync  --config FILE [--once] [--dry-run] [--json]     target-group sync (ELBv2, HAProxy)
//	muster loadgen seed|rebuild|reports
//	muster agent   --upstream URL (--token-file F | --cert F --key F)   local xDS/watch for one workload
//	muster version                                               module version, Go version, VCS revision
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/loadgen"
)

const usage = `muster: the discovery and health-eligibility control plane

usage:
  muster dev     [--addr 127.0.0.1:8080] [--data ./.muster]
  muster serve   [--addr :8080]            (DATABASE_URL and MUSTER_ISSUERS required)
  muster migrate up|down|version|status [--data DIR]
  muster migrate force VERSION [--data DIR]   (after repairing a dirty schema by hand)
  muster token   --data DIR --kind workload|prober|tool|operator [--service S] [--subject X]
                 [--team T] [--role viewer|operator|admin] [--address IP]... [--ttl 1h]
  muster audit verify [--data DIR] [--checkpoints SINK] [--key FILE] [--export FILE]
  muster audit export --since TIME [--until TIME] [--checkpoints SINK] [--out FILE]
  muster seal status [--data DIR]
  muster seal rotate [--data DIR] [--batch N]
  muster breakglass --operator NAME --reason TEXT [--ttl 1h] [--role admin] [--data DIR]
  muster breakglass revoke ID | list [--since 168h]   (where the signing key is; docs/identity.md)
  muster resolve SERVICE [--server URL] [--cache DIR] [--token T] [--data DIR] [--watch] [--json] [--timeout 5s]
  muster tgsync  --config FILE [--once] [--dry-run] [--json] [--own-group] [--metrics-addr ADDR] [--endpoint-url URL]
  muster loadgen seed|rebuild|reports ...   (benchmarks; see muster loadgen)
  muster agent   --upstream URL[,URL] (--token-file FILE | --cert FILE --key FILE) [--service S,...]
                 [--xds-addr 127.0.0.1:15010] [--http-addr 127.0.0.1:15011] [--cache DIR]   (docs/agent.md)
  muster version

environment: DATABASE_URL (or DATABASE_URL_FILE), MUSTER_ISSUERS, MUSTER_AUDIENCE (muster),
             MUSTER_REGION (local), MUSTER_LEASE_TTL (30s), MUSTER_LOG_LEVEL (info),
             MUSTER_ADMISSION_FLOOR (50), MUSTER_ADMISSION_WINDOW (10s), MUSTER_REPLICA (host:port)
             MUSTER_PROXY_PROTOCOL_FROM (or --proxy-protocol-from: the load balancers' networks, CIDR,
             whose connections must carry a PROXY protocol header; docs/production.md)
web UI (serve): MUSTER_UI_ISSUER, MUSTER_UI_CLIENT_ID, MUSTER_UI_CLIENT_SECRET (or _FILE),
             MUSTER_UI_REDIRECT_URL (https://HOST/ui/auth/callback), MUSTER_UI_ROLE_CLAIM (muster_role),
             MUSTER_UI_TEAM_CLAIM (muster_team), MUSTER_UI_INSECURE_COOKIE (0)
audit:       MUSTER_AUDIT_CHECKPOINTS (a directory or s3://bucket/prefix; dev: DATA/audit-checkpoints),
             MUSTER_AUDIT_SIGNING_KEY_FILE (dev: DATA/audit-signing.key), MUSTER_AUDIT_PUBLIC_KEY_FILES,
             MUSTER_AUDIT_CHECKPOINT_INTERVAL (1m), MUSTER_AUDIT_CHECKPOINT_HEARTBEAT (1h),
             MUSTER_AUDIT_S3_ENDPOINT, MUSTER_AUDIT_S3_RETENTION (1825d); AWS_REGION and credentials as the AWS SDK reads them
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, cli.ErrUsage) {
			fmt.Fprintln(os.Stderr, "muster:", err)
		}
		os.Exit(exitCode(err))
	}
}

// exitCode is 2 for usage errors and 1 for everything else.
func exitCode(err error) int {
	if errors.Is(err, cli.ErrUsage) {
		return 2
	}
	return 1
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.ErrUsage
	}
	switch args[0] {
	case "dev":
		return cmdServe(ctx, args[1:], true, stdout, stderr)
	case "serve":
		return cmdServe(ctx, args[1:], false, stdout, stderr)
	case "migrate":
		return cmdMigrate(ctx, args[1:], stdout, stderr)
	case "token":
		return cmdToken(args[1:], stdout, stderr)
	case "audit":
		return cmdAudit(ctx, args[1:], stdout, stderr)
	case "loadgen":
		return loadgen.Run(ctx, loadgen.Env{OpenDB: openToolDB, SealKey: toolSealKey}, args[1:], stdout, stderr)
	case "resolve":
		return cmdResolve(ctx, args[1:], stdout, stderr)
	case "seal":
		return cmdSeal(ctx, args[1:], stdout, stderr)
	case "breakglass":
		return cmdBreakglass(ctx, args[1:], stdout, stderr)
	case "tgsync":
		return cmdTgsync(ctx, args[1:], stdout, stderr)
	case "agent":
		return cmdAgent(ctx, args[1:], stdout, stderr)
	case "version":
		return cmdVersion(args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "muster: unknown command %q\n\n%s", args[0], usage)
	return cli.ErrUsage
}
