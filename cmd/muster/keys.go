package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
)

// sealCensus counts the database's live sealed rows by key, each table
// through the package that owns it.
func sealCensus(ctx context.Context, pool *pgxpool.Pool, now time.Time) (seal.Census, error) {
	var c seal.Census
	err := db.WithTx(ctx, pool, func(q *db.Queries) error {
		c = seal.Census{}
		if err := registry.SealCensus(ctx, q, &c); err != nil {
			return err
		}
		if err := policy.SealCensus(ctx, q, &c, now); err != nil {
			return err
		}
		return shift.SealCensus(ctx, q, &c)
	})
	return c, err
}

// startKeys loads the region's key and checks it against the database
// before anything is served (issue 25): a key problem is a configuration
// fault, and a replica that has one refuses to start, saying which key
// and how many rows, while the replicas already running keep serving.
// It refuses
//   - a keyless replica on a database whose rows are sealed (or that was
//     ever adopted), since the keyed replicas would refuse what it writes;
//   - a muster dev whose key file is gone over a sealed database, rather
//     than make a new key that verifies none of its rows;
//   - a replica whose keys leave more than MismatchShare of the live
//     sealed rows unverified (a rotated, lost or replaced key).
func startKeys(ctx context.Context, cfg Config, pool *pgxpool.Pool, log *slog.Logger) (*audit.KeyFileSigner, audit.Keys, error) {
	census, err := sealCensus(ctx, pool, time.Now())
	if err != nil {
		return nil, nil, fmt.Errorf("check the region's keys against the database: %w", err)
	}
	if f := cfg.Audit.SigningKeyFile; cfg.Dev && f != "" && (census.Sealed() > 0 || len(census.Adoptions) > 0) {
		if _, err := os.Stat(f); errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: the signing key %s is gone, and the database's rows are sealed (%d live rows by key %s); "+
				"muster dev will not make a new key that verifies none of them: put the key file back, or start afresh with another --data folder (docs/keys.md)",
				seal.ErrKeyMismatch, f, census.Sealed(), keyIDs(slices.Sorted(maps.Keys(census.Untrusted(nil)))))
		}
	}
	signer, keys, err := regionKey(cfg)
	if err != nil {
		return nil, nil, err
	}
	trusted := seal.Keys(keys)
	if signer != nil {
		trusted = trusted.With(signer)
	} else {
		trusted = nil // without a key, muster does not seal, whatever public keys it was given
	}
	if err := census.Check(trusted, cfg.Audit.MismatchShare); err != nil {
		return nil, nil, err
	}
	if untrusted := census.Untrusted(trusted); len(untrusted) > 0 && signer != nil {
		log.Warn("some live rows are sealed by keys this replica does not trust; they are refused and alarmed one by one",
			"rows_by_key", untrusted, "sealed_rows", census.Sealed(), "threshold_share", cfg.Audit.MismatchShare)
	}
	return signer, keys, nil
}

// cmdSeal is muster seal status: how many live rows each key covers, and
// whether this configuration trusts it, so a rotation can tell when the
// old key covers nothing and can be retired.
func cmdSeal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "usage: muster seal status [--data DIR]"
	if len(args) == 0 || args[0] != "status" {
		fmt.Fprintln(stderr, usage)
		return cli.ErrUsage
	}
	var dataDir string
	fs := cli.NewFlags("seal status", stderr)
	fs.StringVar(&dataDir, "data", ".muster", "dev data folder (without DATABASE_URL): its cluster and its key")
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 {
		fmt.Fprintln(stderr, usage)
		return cli.ErrUsage
	}
	// Without DATABASE_URL the tool works on the dev data folder, and
	// takes muster dev's key there, as muster dev would.
	cfg := Config{Dev: os.Getenv("DATABASE_URL") == "" && os.Getenv("DATABASE_URL_FILE") == "", DataDir: dataDir}
	pool, closeDB, err := toolPool(ctx, &cfg, stderr)
	if err != nil {
		return err
	}
	defer func() { _ = closeDB() }()
	census, err := sealCensus(ctx, pool, time.Now())
	if err != nil {
		return err
	}
	trusted := seal.Keys{}
	var held string
	if _, err := os.Stat(cfg.Audit.SigningKeyFile); cfg.Audit.SigningKeyFile != "" && err == nil {
		signer, keys, err := regionKey(Config{Audit: cfg.Audit})
		if err != nil {
			return err
		}
		trusted, held = seal.Keys(keys).With(signer), signer.KeyID()
	} else if len(cfg.Audit.PublicKeyFiles) > 0 {
		keys, err := audit.LoadPublicKeys(cfg.Audit.PublicKeyFiles...)
		if err != nil {
			return err
		}
		trusted = seal.Keys(keys)
	}
	byKey := census.ByKey()
	ids := slices.Sorted(maps.Keys(byKey))
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTRUSTED\tINSTANCES\tCONTRACTS\tOVERRIDES\tSHIFTS\tMEMBER_SOURCES\tTOTAL")
	for _, id := range ids {
		name, trust := id, "no"
		switch {
		case id == seal.Unsealed:
			name, trust = "(unsealed)", "-"
		case id == held:
			trust = "yes (signs)"
		default:
			if _, ok := trusted[id]; ok {
				trust = "yes"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\n", name, trust,
			census.Rows[seal.TableInstances][id], census.Rows[seal.TableContracts][id],
			census.Rows[seal.TableOverrides][id], census.Rows[seal.TableShifts][id],
			census.Rows[seal.TableMemberSources][id], byKey[id])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, a := range census.Adoptions {
		fmt.Fprintln(stdout, "adopted: "+a)
	}
	if err := census.Check(trusted, cfg.Audit.MismatchShare); err != nil {
		fmt.Fprintln(stdout, "a replica with these keys would not start: "+err.Error())
	}
	return nil
}

// keyIDs names key ids for a message.
func keyIDs(ids []string) string {
	if len(ids) == 0 {
		return "(none)"
	}
	return fmt.Sprint(ids)
}
