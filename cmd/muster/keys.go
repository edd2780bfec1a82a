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
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/app"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
)

// sealCensus counts the database's live sealed rows by key (app.SealCensus).
func sealCensus(ctx context.Context, pool *pgxpool.Pool, now time.Time) (seal.Census, error) {
	return app.SealCensus(ctx, pool, now)
}

// startKeys loads the region's key and checks it against the database
// before anything is served: a key problem is a configuration
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

// cmdSeal is muster seal status and muster seal rotate.
func cmdSeal(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const usage = "usage: muster seal status [--data DIR]\n       muster seal rotate [--data DIR] [--batch N]"
	if len(args) == 0 || (args[0] != "status" && args[0] != "rotate") {
		fmt.Fprintln(stderr, usage)
		return cli.ErrUsage
	}
	var dataDir string
	batch := 500
	fs := cli.NewFlags("seal "+args[0], stderr)
	fs.StringVar(&dataDir, "data", ".muster", "dev data folder (without DATABASE_URL): its cluster and its key")
	if args[0] == "rotate" {
		fs.IntVar(&batch, "batch", batch, "rows re-sealed per transaction (1-10000)")
	}
	if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 || batch < 1 || batch > 10000 {
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
	if args[0] == "rotate" {
		if err := sealRotate(ctx, cfg, pool, batch, stdout); err != nil {
			return err
		}
	}
	return sealStatus(ctx, cfg, pool, stdout)
}

// sealStatus prints how many live rows each key covers, and whether this
// configuration trusts it.
func sealStatus(ctx context.Context, cfg Config, pool *pgxpool.Pool, stdout io.Writer) error {
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
	fmt.Fprintln(tw, "KEY\tTRUSTED\tINSTANCES\tCONTRACTS\tOVERRIDES\tSHIFTS\tMEMBER_SOURCES\tSERVICES\tGRANTS\tTOTAL")
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
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", name, trust,
			census.Rows[seal.TableInstances][id], census.Rows[seal.TableContracts][id],
			census.Rows[seal.TableOverrides][id], census.Rows[seal.TableShifts][id],
			census.Rows[seal.TableMemberSources][id], census.Rows[seal.TableServices][id],
			census.Rows[seal.TableGrants][id], byKey[id])
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

// sealRotate is muster seal rotate: it re-seals every live sealed row
// (active instances, current contracts, overrides and shifts in force)
// whose seal is by a key other than the signing key and verifies under
// the trusted ones (the signing key and MUSTER_AUDIT_PUBLIC_KEY_FILES,
// where the old key's public half must be), so the old key covers
// nothing and can be retired. Each batch is one transaction: its rows
// are locked, each is re-sealed only if it still carries the seal that
// verified, and one audit row says what the batch did, so the rotation is
// safe beside running replicas (which trust both keys) and resumable: a
// run stopped half way leaves committed batches sealed by the new key,
// and the next run takes what is left. A row whose seal does not verify
// is left as it is (still refused and alarmed): a rotation never
// launders a row written by hand into one the new key vouches for.
func sealRotate(ctx context.Context, cfg Config, pool *pgxpool.Pool, batch int, stdout io.Writer) error {
	if _, err := os.Stat(cfg.Audit.SigningKeyFile); cfg.Audit.SigningKeyFile == "" || err != nil {
		return fmt.Errorf("muster seal rotate needs the new signing key (MUSTER_AUDIT_SIGNING_KEY_FILE) and the old key's public half (MUSTER_AUDIT_PUBLIC_KEY_FILES); docs/keys.md")
	}
	signer, keys, err := regionKey(Config{Audit: cfg.Audit})
	if err != nil {
		return err
	}
	trusted := seal.Keys(keys).With(signer)
	actor := "tool:seal-rotate"
	if u := os.Getenv("USER"); u != "" {
		actor += ":" + u
	}
	type table struct {
		name string
		step func(q *db.Queries, after string, now time.Time) (seal.Batch, error)
	}
	uuidAfter := func(after string) uuid.UUID {
		id, _ := uuid.Parse(after) // "" is the start: uuid.Nil
		return id
	}
	tables := []table{
		{seal.TableInstances, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return registry.ResealInstances(ctx, q, signer, trusted, uuidAfter(after), batch)
		}},
		{seal.TableContracts, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return registry.ResealContracts(ctx, q, signer, trusted, after, batch)
		}},
		{seal.TableOverrides, func(q *db.Queries, after string, now time.Time) (seal.Batch, error) {
			return policy.Reseal(ctx, q, signer, trusted, uuidAfter(after), batch, now)
		}},
		{seal.TableShifts, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return shift.Reseal(ctx, q, signer, trusted, uuidAfter(after), batch)
		}},
		{seal.TableMemberSources, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return registry.ResealMemberSources(ctx, q, signer, trusted, after, batch)
		}},
		{seal.TableServices, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return registry.ResealServices(ctx, q, signer, trusted, after, batch)
		}},
		{seal.TableGrants, func(q *db.Queries, after string, _ time.Time) (seal.Batch, error) {
			return registry.ResealGrants(ctx, q, signer, trusted, after, batch)
		}},
	}
	for _, t := range tables {
		var resealed, changed, refused int
		for after, done := "", false; !done; {
			err := db.WithTx(ctx, pool, func(q *db.Queries) error {
				now := time.Now().UTC().Truncate(time.Microsecond)
				b, err := t.step(q, after, now)
				if err != nil {
					return err
				}
				after, done = b.Next, b.Done
				resealed, changed, refused = resealed+b.Resealed, changed+b.Changed, refused+len(b.Refused)
				if b.Resealed == 0 && len(b.Refused) == 0 {
					return nil
				}
				reason := fmt.Sprintf("re-sealed %d live %s rows under key %s (batch ending at %s)", b.Resealed, t.name, signer.KeyID(), b.Next)
				if len(b.Refused) > 0 {
					reason += fmt.Sprintf("; left %d whose seal does not verify, still refused: %s", len(b.Refused), strings.Join(b.Refused, "; "))
				}
				_, err = audit.Append(ctx, q, now, audit.Entry{ActorKind: "tool", Actor: actor, Action: "seal.rotate",
					TargetKind: "table", Target: t.name, Outcome: audit.Accepted, Reason: reason})
				return err
			})
			if err != nil {
				return fmt.Errorf("re-seal %s (committed batches stay re-sealed; run again to go on): %w", t.name, err)
			}
		}
		fmt.Fprintf(stdout, "%s: re-sealed %d under key %s", t.name, resealed, signer.KeyID())
		if changed > 0 {
			fmt.Fprintf(stdout, ", %d changed meanwhile (sealed anew by muster)", changed)
		}
		if refused > 0 {
			fmt.Fprintf(stdout, ", %d left as they are: their seal does not verify (see the audit log, action seal.rotate)", refused)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}
