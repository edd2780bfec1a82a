package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/breakglass"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/seal"
)

const breakglassUsage = `usage: muster breakglass --operator NAME --reason TEXT [--ttl 1h] [--role admin] [--data DIR]
       muster breakglass revoke ID [--data DIR]
       muster breakglass list [--since 168h] [--data DIR]

Run where the region's signing key is (kubectl exec muster-0 -- muster breakglass ...):
it reads DATABASE_URL and MUSTER_AUDIT_SIGNING_KEY_FILE as muster serve does.
The token is printed alone on stdout; the grant's id and expiry on stderr. docs/identity.md`

// cmdBreakglass is muster breakglass: issue, revoke and list the
// audited, expiring operator grants of internal/breakglass.
func cmdBreakglass(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	verb := "issue"
	if len(args) > 0 && (args[0] == "revoke" || args[0] == "list") {
		verb, args = args[0], args[1:]
	}
	var (
		dataDir, operator, reason, role string
		ttl, since                      time.Duration
		id                              uuid.UUID
	)
	fs := cli.NewFlags("breakglass", stderr)
	fs.StringVar(&dataDir, "data", ".muster", "dev data folder (without DATABASE_URL): its cluster and its key")
	switch verb {
	case "issue":
		fs.StringVar(&operator, "operator", "", "who the grant is for (required): the name the audit log will show as breakglass#operator:NAME")
		fs.StringVar(&reason, "reason", "", "why the glass is broken (required; on the audit record and the alarm)")
		fs.StringVar(&role, "role", string(identity.RoleAdmin), "viewer, operator or admin")
		fs.DurationVar(&ttl, "ttl", breakglass.DefaultTTL, "how long the grant lasts, at most "+breakglass.MaxTTL.String())
	case "revoke":
		if len(args) == 0 {
			fmt.Fprintln(stderr, breakglassUsage)
			return cli.ErrUsage
		}
		var err error
		if id, err = uuid.Parse(args[0]); err != nil {
			fmt.Fprintf(stderr, "muster breakglass revoke: %q is not a grant id (muster breakglass list shows them)\n", args[0])
			return cli.ErrUsage
		}
		args = args[1:]
	case "list":
		fs.DurationVar(&since, "since", 7*24*time.Hour, "list the grants issued within this long")
	}
	if err := cli.Parse(fs, args); err != nil {
		fmt.Fprintln(stderr, breakglassUsage)
		return err
	}
	req := breakglass.Request{Operator: operator, Reason: reason, Role: identity.Role(role), TTL: ttl,
		IssuedBy: issuedBy(), Audience: envOr("MUSTER_AUDIENCE", identity.DefaultAudience)}
	if verb == "issue" {
		// Refused before anything is opened: a bad request changes nothing.
		if err := req.Validate(); err != nil {
			fmt.Fprintln(stderr, "muster breakglass:", err)
			return cli.ErrUsage
		}
	}
	cfg := Config{Dev: os.Getenv("DATABASE_URL") == "" && os.Getenv("DATABASE_URL_FILE") == "", DataDir: dataDir}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { _ = closeDB() }()
	signer, keys, err := regionKey(cfg)
	if err != nil {
		return err
	}
	switch verb {
	case "revoke":
		g, err := breakglass.Revoke(ctx, pool, id, issuedBy(), time.Now())
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked break-glass grant %s for %s; every replica refuses its token within %s\n", g.ID, g.Operator, breakglass.DefaultCacheFor)
		return nil
	case "list":
		trusted := seal.Keys(keys)
		if signer != nil {
			trusted = trusted.With(signer)
		}
		grants, err := breakglass.List(ctx, pool, trusted, time.Now().Add(-since), 1000)
		if err != nil {
			return err
		}
		now := time.Now()
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tOPERATOR\tROLE\tSTATE\tISSUED\tEXPIRES\tISSUED_BY\tREASON")
		for _, g := range grants {
			state := "expired"
			switch {
			case g.SealErr != nil:
				state = "refused (not as muster wrote it)"
			case g.RevokedAt != nil:
				state = "revoked " + g.RevokedAt.UTC().Format(time.RFC3339) + " by " + g.RevokedBy
			case g.Live(now):
				state = "live"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.ID, g.Operator, g.Role, state,
				g.IssuedAt.UTC().Format(time.RFC3339), g.ExpiresAt.UTC().Format(time.RFC3339), g.IssuedBy, strconv.Quote(g.Reason))
		}
		return tw.Flush()
	}
	if signer == nil {
		return breakglass.ErrNoKey
	}
	g, tok, err := breakglass.Issue(ctx, pool, signer, cfg.Region, req, time.Now())
	if errors.Is(err, breakglass.ErrInvalid) {
		fmt.Fprintln(stderr, "muster breakglass:", err)
		return cli.ErrUsage
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "break-glass grant %s: %s acts as %s in region %s until %s; audited as %s#operator:%s.\n"+
		"Revoke it when done: muster breakglass revoke %s\n",
		g.ID, g.Operator, g.Role, g.Region, g.ExpiresAt.Format(time.RFC3339), breakglass.PrincipalIssuer, g.Operator, g.ID)
	fmt.Fprintln(stdout, tok)
	return nil
}

// issuedBy names who runs the command: the OS user (its name, or its uid
// in an image without a passwd entry) at the host (the pod's name).
func issuedBy() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "uid:" + strconv.Itoa(os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown-host"
	}
	return name + "@" + host
}
