package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
	"github.com/musterhq/muster/internal/shift"
	bgworker "github.com/musterhq/muster/internal/worker"
)

// WorkerKeyWatch names the worker that keeps checking the region's keys
// against the database's seals.
const WorkerKeyWatch = "key-watch"

// AlarmSealKeyMismatch is open while more than the mismatch share of the
// live sealed rows are sealed by keys this replica does not trust.
const AlarmSealKeyMismatch = "seal_key_mismatch"

// AlarmKeylessSealed is open while a replica without the signing key runs
// on a region whose rows are sealed: it believes none of the rows (an
// unsealed one no more than a keyed replica would), keeps what it had,
// and must be given the key.
const AlarmKeylessSealed = "keyless_sealed"

// SealCensus counts the database's live sealed rows by key, each table
// through the package that owns it (muster serve's start-up check, muster
// seal status and the key watch).
func SealCensus(ctx context.Context, pool *pgxpool.Pool, now time.Time) (seal.Census, error) {
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

// KeyWatchConfig tunes the key watch.
type KeyWatchConfig struct {
	// Every is how often the live rows are counted by key: 30 s.
	Every time.Duration
	// Share is the share of live sealed rows that may be sealed by keys
	// this replica does not trust before it alarms:
	// seal.DefaultMismatchShare.
	Share float64
}

// KeyWatch is the running replica's half of the start-up key check
// (cmd/muster/keys.go): a replica that finds, while it runs, that its keys
// verify fewer of the live rows than the share allows (another replica
// rolled out with a new key it was not given, or muster seal rotate run
// before every replica trusted the new key) keeps what it has (it
// applies the instances, contracts and drains it verified; seals are
// checked when a row is new to it) and raises seal_key_mismatch, naming
// the keys and the rows, instead of acting on the rows one by one as
// forgeries. It never refuses anything itself.
//
// On a keyless replica it watches for the region's rows becoming sealed
// (a keyed replica rolled out beside it, seals adopted): the start-up
// check refuses a keyless replica a sealed database, but one already
// running would go on believing rows no keyed replica believes. The rows'
// owners seal trust themselves when they read a sealed row (seal.Trust.For);
// the watch's count is the backstop (an adoption recorded, a sealed row
// of a table this replica has not read again) and raises keyless_sealed.
type KeyWatch struct {
	cfg    KeyWatchConfig
	pool   *pgxpool.Pool
	keys   seal.Keys
	trust  *seal.Trust
	log    *slog.Logger
	now    func() time.Time
	runner bgworker.Runner

	mu        sync.Mutex
	untrusted map[string]int64 // rows by untrusted key, at the last count
	sealed    int64
	since     time.Time // when the share was first exceeded; zero while it is not
	detail    string
	// keyless: since the trust was first seen sealed, and what the
	// last count said of the sealed rows.
	keylessSince  time.Time
	keylessDetail string
}

// NewKeyWatch returns a stopped key watch over pool for a replica
// trusting keys (nil: a keyless replica, which has nothing to check).
//
// trust is the replica's seal.Trust, which a keyless replica's watch
// seals once the region's rows are (nil: nothing to seal).
func NewKeyWatch(cfg KeyWatchConfig, pool *pgxpool.Pool, keys seal.Keys, trust *seal.Trust, now func() time.Time, log *slog.Logger, reg prometheus.Registerer) (*KeyWatch, error) {
	if cfg.Every == 0 {
		cfg.Every = 30 * time.Second
	}
	if cfg.Share == 0 {
		cfg.Share = seal.DefaultMismatchShare
	}
	if cfg.Every < 0 || cfg.Share < 0 || cfg.Share >= 1 {
		return nil, fmt.Errorf("key watch: Every %s must not be negative and Share %g must be in [0,1)", cfg.Every, cfg.Share)
	}
	k := &KeyWatch{cfg: cfg, pool: pool, keys: keys, trust: trust, log: log.With("worker", WorkerKeyWatch), now: now}
	if reg != nil {
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_seal_rows_untrusted",
			Help: "Live sealed rows (active instances, current contracts, overrides and shifts in force) sealed by keys this replica does not trust, at the key watch's last count (docs/keys.md). Above the mismatch share of muster_seal_rows it is the seal_key_mismatch alarm."},
			func() float64 { n, _ := k.Counts(); return float64(n) })); err != nil {
			return nil, err
		}
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_seal_rows",
			Help: "Live sealed rows, at the key watch's last count."},
			func() float64 { _, n := k.Counts(); return float64(n) })); err != nil {
			return nil, err
		}
		if err := reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "muster_seal_keyless_sealed",
			Help: "1 while this replica has no signing key and the region's rows are sealed (keyless_sealed): it believes no row, unsealed or sealed, and keeps what it had."},
			func() float64 { return b2f(k.trust.Sealed()) })); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// Start counts once, then every Every.
func (k *KeyWatch) Start(ctx context.Context) error {
	if len(k.keys) == 0 && !k.watchesKeyless() {
		return nil // keyless, with no trust to seal: nothing to check
	}
	return k.runner.Start(ctx, func(ctx context.Context) {
		bgworker.Every(ctx, k.cfg.Every, func(ctx context.Context) {
			if err := k.Check(ctx); err != nil && ctx.Err() == nil {
				k.log.Warn("count the live rows by sealing key", "err", err)
			}
		})
	})
}

// Stop stops it.
func (k *KeyWatch) Stop() { k.runner.Stop() }

// Check counts the live rows by key once and opens or closes the alarm.
// A count that fails (PostgreSQL away) leaves the alarm as it was.
func (k *KeyWatch) Check(ctx context.Context) error {
	if len(k.keys) == 0 && !k.watchesKeyless() {
		return nil
	}
	if k.trust.Sealed() {
		k.noteKeyless(seal.Census{}, false) // sealed by a row read: the alarm opens now
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := SealCensus(ctx, k.pool, k.now())
	if err != nil {
		return err
	}
	if len(k.keys) == 0 {
		if errors.Is(c.Check(nil, k.cfg.Share), seal.ErrKeyless) {
			k.noteKeyless(c, true)
		}
		return nil
	}
	untrusted := c.Untrusted(k.keys)
	check := c.Check(k.keys, k.cfg.Share)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.untrusted, k.sealed = untrusted, c.Sealed()
	switch {
	case check == nil:
		if !k.since.IsZero() {
			k.log.Info("the live rows verify under this replica's keys again", "untrusted_rows", untrusted)
		}
		k.since, k.detail = time.Time{}, ""
	case errors.Is(check, seal.ErrKeyMismatch):
		if k.since.IsZero() {
			k.since = k.now()
			k.log.Error("this replica's keys no longer verify the database's live rows; it keeps what it applied and alarms", "err", check)
		}
		ids := slices.Sorted(maps.Keys(untrusted))
		k.detail = fmt.Sprintf("this replica keeps the rows it verified and applies none sealed by key %s: %v. "+
			"Give every replica the new key's public half (MUSTER_AUDIT_PUBLIC_KEY_FILES) before muster seal rotate, or roll this one with it (docs/keys.md)",
			strings.Join(ids, ", "), check)
	}
	return nil
}

// watchesKeyless: a keyless replica with a trust to seal.
func (k *KeyWatch) watchesKeyless() bool { return k.trust != nil && k.trust.Keyless() }

// noteKeyless seals the trust (when the count c found sealed rows) and
// opens keyless_sealed, or updates its detail.
func (k *KeyWatch) noteKeyless(c seal.Census, counted bool) {
	changed := k.trust.Seal()
	k.mu.Lock()
	defer k.mu.Unlock()
	first := k.keylessSince.IsZero()
	if first {
		k.keylessSince = k.now()
	}
	if counted {
		k.sealed = c.Sealed()
		k.keylessDetail = fmt.Sprintf("%d live rows are sealed", c.Sealed())
		if len(c.Adoptions) > 0 {
			k.keylessDetail += fmt.Sprintf(", seal adoptions recorded (%s)", strings.Join(c.Adoptions, ", "))
		}
	} else if k.keylessDetail == "" {
		k.keylessDetail = "a sealed row was read"
	}
	if first || changed {
		k.log.Error("no signing key, and the region's rows are sealed: this replica now believes no row (unsealed rows no more than a keyed replica would) and keeps the instances, overrides, drains and contracts it had",
			"seen", k.keylessDetail)
	}
}

// Counts are the untrusted and all live sealed rows at the last count.
func (k *KeyWatch) Counts() (untrusted, sealed int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, n := range k.untrusted {
		untrusted += n
	}
	return untrusted, k.sealed
}

// Alarms is seal_key_mismatch while it is open, and keyless_sealed while
// this keyless replica's trust is sealed.
func (k *KeyWatch) Alarms() []assembler.Alarm {
	sealed := k.trust.Sealed()
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []assembler.Alarm
	if !k.since.IsZero() {
		out = append(out, assembler.Alarm{Kind: AlarmSealKeyMismatch, Since: k.since, Detail: k.detail})
	}
	if sealed {
		since, seen := k.keylessSince, k.keylessDetail
		if since.IsZero() { // sealed by a row read since the last check
			since, seen = k.now(), "a sealed row was read"
		}
		out = append(out, assembler.Alarm{Kind: AlarmKeylessSealed, Since: since, Detail: fmt.Sprintf(
			"this replica has no signing key while the region's rows are sealed (%s): it believes no row now, unsealed or sealed, so registrations, deregistrations, overrides, drains and contracts written since reach it not at all; "+
				"it keeps routing the instances and applying the overrides, drains and contracts it had. Set MUSTER_AUDIT_SIGNING_KEY_FILE to the region's signing key and roll it (docs/keys.md)", seen)})
	}
	return out
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
