package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/rdsca"
)

// dbTarget is how muster connects to its database: the URL, and for Aurora
// with IAM database authentication (MUSTER_DB_IAM=1) the tokens that stand
// in for the URL's password. Built once per process, so every pool and the
// migrator share one cached token.
type dbTarget struct {
	url     string
	iam     *db.IAMTokens // nil: the URL's own password (or none)
	migrate string        // MigrateUp or MigrateSkip (Config.Migrate)
	// roots is the RDS CA bundle built into muster when it verifies the
	// server (see rdsRoots); nil: the URL's own settings alone.
	roots *x509.CertPool
}

// What a start does with the schema (MUSTER_MIGRATE).
const (
	MigrateUp   = "up"
	MigrateSkip = "skip"
)

// newDBTarget prepares the connections to dbURL. For serve the URL gets
// target_session_attrs=read-write unless it sets target_session_attrs
// itself, so no connection settles on a reader or a demoted writer. With
// cfg.DBIAM the tokens are signed for the URL's user on its first host and
// port, in MUSTER_DB_IAM_REGION, else the region in an RDS host name, else
// the AWS SDK's configured region; the credentials come from the SDK's
// default chain (IRSA, ECS task role, instance profile, environment).
func newDBTarget(ctx context.Context, cfg Config, dbURL string) (dbTarget, error) {
	t := dbTarget{url: dbURL, migrate: cmpOr(cfg.Migrate, MigrateUp)}
	var err error
	// A key=value DSN (which tools accept; serve's migrations need a URL)
	// is left as it is: it can say target_session_attrs itself.
	if !cfg.Dev && (strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://")) {
		u, err := db.WithReadWrite(dbURL)
		if err != nil {
			return dbTarget{}, err
		}
		t.url = u
	}
	if t.roots, err = rdsRoots(t.url, cfg.DBIAM); err != nil {
		return dbTarget{}, err
	}
	if !cfg.DBIAM {
		return t, nil
	}
	cc, err := pgx.ParseConfig(t.url)
	if err != nil {
		return dbTarget{}, errors.New("MUSTER_DB_IAM: DATABASE_URL does not parse") // pgx's error may quote the URL
	}
	if cc.User == "" {
		return dbTarget{}, errors.New("MUSTER_DB_IAM: DATABASE_URL names no user to sign tokens for")
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx)
	if err != nil {
		return dbTarget{}, fmt.Errorf("MUSTER_DB_IAM: load AWS configuration: %w", err)
	}
	region := cmpOr(cfg.DBIAMRegion, cmpOr(db.RegionFromHost(cc.Host), awsCfg.Region))
	if region == "" {
		return dbTarget{}, fmt.Errorf("MUSTER_DB_IAM: no AWS region for %s: set MUSTER_DB_IAM_REGION or AWS_REGION", cc.Host)
	}
	signer := db.AWSSigner{
		Endpoint: net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))),
		Region:   region, User: cc.User, Creds: awsCfg.Credentials,
	}
	if t.iam, err = db.NewIAMTokens(signer, nil, 0); err != nil {
		return dbTarget{}, err
	}
	return t, nil
}

// rdsRoots decides whether muster verifies the database server against
// the RDS CA bundle built into it (internal/rdsca): when the connection
// string asks for verification (sslmode verify-full or verify-ca) but
// names no sslrootcert, with IAM database authentication (which only RDS
// and Aurora take) or to hosts that are all RDS endpoints. The image's
// system roots hold no RDS CA, so without it every such connection would
// fail with "certificate signed by unknown authority". An sslrootcert
// wins (a bundle newer than this release's, or a CA of your own); a
// connection string pgx cannot parse is left to fail where it is opened.
func rdsRoots(dbURL string, iam bool) (*x509.CertPool, error) {
	hosts, err := db.SystemRootHosts(dbURL)
	if err != nil || len(hosts) == 0 {
		return nil, nil
	}
	if !iam && slices.ContainsFunc(hosts, func(h string) bool { return !isRDSHost(h) }) {
		return nil, nil
	}
	for _, h := range hosts {
		// A region the bundle has no CA for would fail every connection
		// with "unknown authority": say so now, with the fix.
		if r := db.RegionFromHost(strings.ToLower(h)); isRDSHost(h) && !rdsca.HasRegion(r) {
			return nil, fmt.Errorf("DATABASE_URL names no sslrootcert, and the RDS CA bundle built into muster (%s) holds no CA of %s's region %q: "+
				"mount an RDS CA bundle that covers it (AWS publishes one per region) and name it in sslrootcert (docs/production.md, \"The RDS CA bundle\")", rdsca.Info().Package, h, r)
		}
	}
	return rdsca.Pool(), nil
}

// isRDSHost reports whether host is an RDS or Aurora endpoint (a cluster,
// instance or proxy endpoint under rds.amazonaws.com, or .com.cn in the
// China regions).
func isRDSHost(host string) bool {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	return strings.HasSuffix(h, ".rds.amazonaws.com") || strings.HasSuffix(h, ".rds.amazonaws.com.cn")
}

// logRoots says, once at start, that the built-in RDS bundle is in use
// and which one, so an operator whose verification fails knows what the
// server was checked against.
func (t dbTarget) logRoots(log *slog.Logger) {
	if t.roots == nil {
		return
	}
	b := rdsca.Info()
	log.Info("DATABASE_URL names no sslrootcert: the database server's certificate is verified against the RDS CA bundle built into muster (mount a newer bundle and name it in sslrootcert to replace it)",
		"bundle", b.Package, "certificates", b.Certs)
}

// open opens a pool on the target; c.URL, c.IAM and c.RootCAs are filled
// in.
func (t dbTarget) open(ctx context.Context, c db.PoolConfig) (*pgxpool.Pool, error) {
	c.URL, c.IAM, c.RootCAs = t.url, t.iam, t.roots
	p, err := db.OpenPool(ctx, c)
	return p, t.explainRoots(err)
}

// explainRoots adds to a certificate refusal under the built-in RDS CA
// bundle what the server was verified against and the way out, so an
// operator of `muster migrate` (whose quiet log leaves out logRoots'
// line) is not left guessing.
func (t dbTarget) explainRoots(err error) error {
	var unknown x509.UnknownAuthorityError
	if err == nil || t.roots == nil || !errors.As(err, &unknown) {
		return err
	}
	return fmt.Errorf("%w (verified against the RDS CA bundle built into muster, %s, as DATABASE_URL names no sslrootcert: if this is the database, name a bundle that holds its CA in sslrootcert)", err, rdsca.Info().Package)
}

// prepareSchema applies the pending migrations. A database a newer release
// already migrated (clean) is used as it is, with a warning: during a
// rolling upgrade a replica of the older release that restarts must
// start, and migrations are additive by policy (docs/replicas.md,
// "Rolling upgrade"). A schema left dirty by a replica killed during a
// migration that runs in one transaction is repaired, with a warning (the
// migration is run again: db.Migrator.Up); any other dirty schema is
// refused, naming `muster migrate force`.
//
// With MUSTER_MIGRATE=skip nothing is applied or repaired: the schema is
// only looked at (checkSchema).
func (t dbTarget) prepareSchema(log *slog.Logger) error {
	mg, err := t.migrator()
	if err != nil {
		return err
	}
	defer mg.Close()
	if t.migrate == MigrateSkip {
		return checkSchema(mg, log)
	}
	err = mg.Up()
	if mg.Repaired != 0 {
		log.Warn("the schema was dirty: a migration was stopped half-way (a replica killed while migrating); it runs in one transaction, so nothing of it stayed, and it was run again",
			"migration", mg.Repaired, "err", err)
	}
	if errors.Is(err, db.ErrSchemaAhead) {
		log.Warn("the database was migrated by a newer release; this one starts on it unchanged (migrations are additive): finish the rolling upgrade",
			"err", err)
		return nil
	}
	return err
}

// checkSchema is a start's look at the schema under MUSTER_MIGRATE=skip,
// where a migrations Job (the chart's, run by Helm before each rollout)
// applies the migrations and the replicas never do: a replica killed by
// its startup probe mid-migration can then not leave the schema dirty,
// and a long migration is not cut short by a probe. A schema behind this
// release, or dirty (the Job is still running, or stopped half-way), is
// refused with the reason: the pod exits, Kubernetes restarts it, and it
// starts once the Job has finished. A schema ahead (a newer release
// migrated it) is taken with the same warning as under MUSTER_MIGRATE=up.
func checkSchema(mg *db.Migrator, log *slog.Logger) error {
	err := mg.Check()
	var behind *db.BehindError
	var dirty *db.DirtyError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, db.ErrSchemaAhead):
		log.Warn("the database was migrated by a newer release; this one starts on it unchanged (migrations are additive): finish the rolling upgrade",
			"err", err)
		return nil
	case errors.As(err, &behind):
		return fmt.Errorf("MUSTER_MIGRATE=skip: the database's schema is at version %d, behind this release's last migration %d, and this replica does not migrate: "+
			"the migrations Job (`muster migrate up`) has not finished; this start is refused so the replica is restarted and tries again (docs/production.md, Migrations)",
			behind.Database, behind.Known)
	case errors.As(err, &dirty):
		return fmt.Errorf("MUSTER_MIGRATE=skip: the schema is dirty at version %d: migration %d is running in the migrations Job, or stopped half-way; this replica does not migrate, so this start is refused. "+
			"If no Job is running, run `muster migrate up` (it runs a migration that stopped half-way again when it runs in one transaction; `muster migrate status` tells), "+
			"else repair it and run `muster migrate force VERSION` (docs/production.md, Migrations)",
			dirty.Version, dirty.Version)
	}
	return fmt.Errorf("MUSTER_MIGRATE=skip: look at the schema's version: %w", err)
}

// migrator opens a migrator on the target, with its IAM tokens if any.
func (t dbTarget) migrator() (*db.Migrator, error) {
	mg, err := db.OpenMigratorRoots(t.url, t.iam, t.roots)
	return mg, t.explainRoots(err)
}
