package audit

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/worker"
)

// CheckpointerConfig configures a Checkpointer.
type CheckpointerConfig struct {
	Pool   *pgxpool.Pool
	Signer Signer
	Sink   Sink
	// Keys are the keys earlier checkpoints in the sink may be signed
	// by (a rotated-out key); the Signer's own key is always trusted.
	Keys Keys
	// Interval between checkpoints: 1 minute.
	Interval time.Duration
	// Heartbeat: a checkpoint is written at least this often even when
	// the chain has not moved (1 hour), so a verifier knows the writer
	// was alive; in between, an unchanged head writes nothing.
	Heartbeat time.Duration
	Logger    *slog.Logger
	// Registerer receives the checkpointer's metrics; nil registers
	// nowhere.
	Registerer prometheus.Registerer
	// Now is the clock (time.Now).
	Now func() time.Time
}

// Validate checks the configuration and fills defaults.
func (c *CheckpointerConfig) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("checkpointer: Pool is required")
	case c.Signer == nil:
		return errors.New("checkpointer: Signer is required")
	case c.Sink == nil:
		return errors.New("checkpointer: Sink is required")
	case c.Interval < 0 || c.Heartbeat < 0:
		return errors.New("checkpointer: Interval and Heartbeat must not be negative")
	}
	if c.Interval == 0 {
		c.Interval = time.Minute
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = time.Hour
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	keys := Keys{c.Signer.KeyID(): c.Signer.Public()}
	for id, k := range c.Keys {
		keys[id] = k
	}
	c.Keys = keys
	return nil
}

// Checkpointer writes a signed checkpoint of the chain's head to a sink
// outside the database every Interval and when it stops. Before signing it
// verifies, in Go, every row since the previous checkpoint and that the row
// the previous checkpoint named is unchanged: a checkpoint vouches for a
// chain that extends the one before it, never for a rewritten or
// rolled-back one (those are logged as errors, counted in
// muster_audit_checkpoint_failures_total, and left unsigned).
type Checkpointer struct {
	cfg    CheckpointerConfig
	log    *slog.Logger
	runner worker.Runner

	mu   sync.Mutex // serialises runOnce (the loop and the final one)
	last *Checkpoint

	failures prometheus.Counter
	written  prometheus.Counter
	seq      prometheus.Gauge
}

// NewCheckpointer returns a stopped Checkpointer.
func NewCheckpointer(cfg CheckpointerConfig) (*Checkpointer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := &Checkpointer{cfg: cfg, log: cfg.Logger.With("worker", "audit-checkpointer", "sink", cfg.Sink.String())}
	c.failures = prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_audit_checkpoint_failures_total",
		Help: "Audit checkpoint rounds that wrote nothing because of an error: the sink or database unreachable, or a chain that does not extend the last checkpoint (rewritten or rolled back)."})
	c.written = prometheus.NewCounter(prometheus.CounterOpts{Name: "muster_audit_checkpoints_written_total", Help: "Signed audit checkpoints written to the sink."})
	c.seq = prometheus.NewGauge(prometheus.GaugeOpts{Name: "muster_audit_checkpoint_seq", Help: "The audit seq the newest checkpoint this process wrote or read anchors."})
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{c.failures, c.written, c.seq} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("checkpointer: register metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Start runs the loop until ctx ends or Stop is called; either way one
// last checkpoint is written as it ends.
func (c *Checkpointer) Start(ctx context.Context) error { return c.runner.Start(ctx, c.loop) }

// Stop ends the loop, after its last checkpoint. Safe to call twice or
// before Start.
func (c *Checkpointer) Stop() { c.runner.Stop() }

func (c *Checkpointer) loop(ctx context.Context) {
	// A round is never cut short by Stop: a round cancelled inside its
	// transaction leaves the checkpoint lock held until the server has
	// rolled it back, and the final round, finding the lock taken, would
	// write nothing (as it must when another replica is the writer).
	// Stop waits for the round instead (milliseconds; 15 s at most).
	round := func(final bool) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
		defer cancel()
		c.tick(rctx, final)
	}
	defer round(true)
	round(false)
	worker.Every(ctx, c.cfg.Interval, func(context.Context) { round(false) })
}

func (c *Checkpointer) tick(ctx context.Context, final bool) {
	cp, err := c.RunOnce(ctx, final)
	switch {
	case err != nil:
		c.failures.Inc()
		c.log.Error("audit checkpoint not written", "err", err)
	case cp != nil:
		c.log.Debug("audit checkpoint written", "n", cp.N, "seq", cp.Seq)
	}
}

// ErrNotWriter is returned by RunOnce when another replica holds the
// checkpoint lock.
var ErrNotWriter = errors.New("another replica is writing audit checkpoints")

// RunOnce writes one checkpoint if the chain moved since the last one (or
// the last is older than Heartbeat, or force), returning it; nil when there
// was nothing to write or another replica is the writer.
func (c *Checkpointer) RunOnce(ctx context.Context, force bool) (*Checkpoint, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out *Checkpoint
	err := db.WithTx(ctx, c.cfg.Pool, func(q *db.Queries) error {
		got, err := q.AuditCheckpointLock(ctx)
		if err != nil {
			return fmt.Errorf("take the checkpoint lock: %w", err)
		}
		if !got {
			return ErrNotWriter
		}
		if err := c.catchUp(ctx); err != nil {
			return err
		}
		seq, head, err := c.extend(ctx, q)
		if err != nil {
			return err
		}
		now := c.cfg.Now()
		if l := c.last; l != nil && !force && l.Seq == seq && now.Sub(l.At) < c.cfg.Heartbeat {
			return nil
		}
		next := Checkpoint{N: 1, Seq: seq, Head: head, At: now}
		if l := c.last; l != nil {
			next.N, next.Prev = l.N+1, l.Hash()
		}
		signed, data, err := Sign(ctx, c.cfg.Signer, next)
		if err != nil {
			return err
		}
		if err := c.cfg.Sink.Put(ctx, signed.Name(), data); err != nil {
			return fmt.Errorf("put checkpoint %d in %s: %w", signed.N, c.cfg.Sink, err)
		}
		c.last, out = &signed, &signed
		c.written.Inc()
		c.seq.Set(float64(signed.Seq))
		return nil
	})
	if errors.Is(err, ErrNotWriter) {
		return nil, nil
	}
	return out, err
}

// catchUp reads the checkpoints written since the last one this process
// knows (all of them at start: the chain of checkpoints lives in the sink
// and survives restarts), checking each signature and link.
func (c *Checkpointer) catchUp(ctx context.Context) error {
	after := ""
	if c.last != nil {
		after = c.last.Name()
	}
	names, err := c.cfg.Sink.List(ctx, after)
	if err != nil {
		return fmt.Errorf("list checkpoints in %s: %w", c.cfg.Sink, err)
	}
	if c.last == nil && len(names) > 1 {
		// At start only the newest checkpoint matters to the writer:
		// the chain before it is the verifier's to check, and reading
		// years of checkpoints at every start would cost as much.
		names = names[len(names)-1:]
	}
	for i, name := range names {
		data, err := c.cfg.Sink.Get(ctx, name)
		if err != nil {
			return fmt.Errorf("read checkpoint %s: %w", name, err)
		}
		cp, err := DecodeCheckpoint(data, c.cfg.Keys)
		if err != nil {
			return fmt.Errorf("checkpoint %s in %s: %w", name, c.cfg.Sink, err)
		}
		if c.last != nil || i > 0 || cp.N == 1 {
			if err := checkLink(name, c.last, cp); err != nil {
				return err
			}
		} else if name != cp.Name() {
			return &BrokenError{Seq: cp.Seq, Checkpoint: name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("the object holds checkpoint %d", cp.N)}
		}
		c.last = &cp
		c.seq.Set(float64(cp.Seq))
	}
	return nil
}

// extend verifies that the chain extends the last checkpoint (its row is
// unchanged, every row since is sound) and returns the head to sign.
func (c *Checkpointer) extend(ctx context.Context, q *db.Queries) (int64, []byte, error) {
	from, prev := int64(0), genesis
	if l := c.last; l != nil && l.Seq > 0 {
		r, err := q.AuditRowGet(ctx, l.Seq)
		if errors.Is(err, pgx.ErrNoRows) {
			h, _ := q.AuditHead(ctx)
			return 0, nil, &BrokenError{Seq: h.Seq, Checkpoint: l.Name(), Kind: "rollback", LostFrom: h.Seq + 1, LostTo: l.Seq,
				Reason: fmt.Sprintf("the table ends at seq %d, behind checkpoint %d's seq %d: seqs %d to %d are lost; no checkpoint is signed over a rolled-back chain (see docs/audit.md)", h.Seq, l.N, l.Seq, h.Seq+1, l.Seq)}
		}
		if err != nil {
			return 0, nil, fmt.Errorf("read audit row %d: %w", l.Seq, err)
		}
		if row := rowFrom(r); !bytes.Equal(row.Hash, l.Head) || !bytes.Equal(row.Digest(), l.Head) {
			return 0, nil, &BrokenError{Seq: l.Seq, Checkpoint: l.Name(), Kind: "rewritten",
				Reason: fmt.Sprintf("row %d no longer hashes to the head checkpoint %d recorded (%x); no checkpoint is signed over a rewritten chain", l.Seq, l.N, l.Head)}
		}
		from, prev = l.Seq, l.Head
	}
	rep, err := walk(ctx, q, from, prev, nil)
	if err != nil {
		return 0, nil, err
	}
	head, err := hex.DecodeString(rep.Head)
	return rep.HeadSeq, head, err
}
