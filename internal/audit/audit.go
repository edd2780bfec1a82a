package audit

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
)

// Outcome says whether the audited attempt took effect.
type Outcome string

// Outcomes.
const (
	Accepted Outcome = "accepted"
	Refused  Outcome = "refused"
)

// Entry is what a caller records; the log fills in seq, time and hashes.
type Entry struct {
	ActorKind  string // workload, prober, tool, operator, system
	Actor      string // the principal, e.g. "operator:oscar"
	Action     string // e.g. "instance.register", "contract.update"
	TargetKind string // e.g. "service", "instance"
	Target     string
	Outcome    Outcome
	Reason     string // why it was refused, or a note on an accepted change
	Before     any    // the target before the change (nil when none)
	After      any    // the target after the change, or what was asked for when refused
}

// Event is a stored audit row.
type Event struct {
	Seq        int64           `json:"seq"`
	At         time.Time       `json:"at"`
	ActorKind  string          `json:"actor_kind"`
	Actor      string          `json:"actor"`
	Action     string          `json:"action"`
	TargetKind string          `json:"target_kind"`
	Target     string          `json:"target"`
	Outcome    Outcome         `json:"outcome"`
	Reason     string          `json:"reason,omitempty"`
	Before     json.RawMessage `json:"before,omitempty"`
	After      json.RawMessage `json:"after,omitempty"`
	Hash       string          `json:"hash"`
}

var genesis = make([]byte, 32)

// Append writes e as the next row of the chain using q, which should be bound
// to the transaction that makes the change, so both commit or neither does.
func Append(ctx context.Context, q *db.Queries, now time.Time, e Entry) (Event, error) {
	before, err := marshal(e.Before)
	if err != nil {
		return Event{}, fmt.Errorf("audit %s: encode before: %w", e.Action, err)
	}
	after, err := marshal(e.After)
	if err != nil {
		return Event{}, fmt.Errorf("audit %s: encode after: %w", e.Action, err)
	}
	if e.Outcome != Accepted && e.Outcome != Refused {
		return Event{}, fmt.Errorf("audit %s: outcome %q is neither accepted nor refused", e.Action, e.Outcome)
	}
	if err := q.AuditLock(ctx); err != nil {
		return Event{}, fmt.Errorf("audit %s: lock chain: %w", e.Action, err)
	}
	seq, prev := int64(0), genesis
	head, err := q.AuditHead(ctx)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return Event{}, fmt.Errorf("audit %s: read chain head: %w", e.Action, err)
	default:
		seq, prev = head.Seq, head.Hash
	}
	row, err := q.AuditInsert(ctx, db.AuditInsertParams{
		Seq:        seq + 1,
		At:         now.UTC().Truncate(time.Microsecond),
		ActorKind:  e.ActorKind,
		Actor:      e.Actor,
		Action:     e.Action,
		TargetKind: e.TargetKind,
		Target:     e.Target,
		Outcome:    string(e.Outcome),
		Reason:     e.Reason,
		Before:     before,
		After:      after,
		PrevHash:   prev,
	})
	if err != nil {
		return Event{}, fmt.Errorf("audit %s: insert: %w", e.Action, err)
	}
	return fromRow(row), nil
}

// AppendAlone writes e in a transaction of its own: for refused attempts,
// which change nothing else.
func AppendAlone(ctx context.Context, pool *pgxpool.Pool, now time.Time, e Entry) (Event, error) {
	var ev Event
	err := db.WithTx(ctx, pool, func(q *db.Queries) error {
		var err error
		ev, err = Append(ctx, q, now, e)
		return err
	})
	return ev, err
}

// Filter selects audit events; empty fields match everything.
type Filter struct {
	Actor, Action, TargetKind, Target string
	// Service selects the events aimed at a service or at any of its
	// instances.
	Service string
	Outcome Outcome
	// BeforeSeq lists events older than this seq (0: from the newest).
	BeforeSeq int64
	Limit     int
}

// List returns events newest first.
func List(ctx context.Context, q *db.Queries, f Filter) ([]Event, error) {
	rows, err := q.AuditList(ctx, db.AuditListParams{
		BeforeSeq:  f.BeforeSeq,
		Actor:      optional(f.Actor),
		Action:     optional(f.Action),
		TargetKind: optional(f.TargetKind),
		Target:     optional(f.Target),
		Outcome:    optional(string(f.Outcome)),
		Service:    optional(f.Service),
		Lim:        int32(f.Limit),
	})
	if err != nil {
		return nil, fmt.Errorf("list audit events: %w", err)
	}
	out := make([]Event, len(rows))
	for i, r := range rows {
		out[i] = fromRow(r)
	}
	return out, nil
}

// BrokenError names the first place at which the chain does not verify:
// the row (Seq), and the checkpoint when one was involved.
type BrokenError struct {
	Seq int64
	// Checkpoint names the checkpoint that disagrees, when one does.
	Checkpoint string
	// Kind says what broke: "gap", "link", "content" (a row's columns do
	// not hash to its hash), "rewritten" (the chain is consistent but
	// disagrees with a checkpoint: rows were rewritten and re-chained),
	// "rollback" (rows a checkpoint saw are gone), "signature",
	// "checkpoint-chain" (a checkpoint is missing or out of order).
	Kind   string
	Reason string
	// LostFrom and LostTo are the seqs lost in a rollback (Kind
	// "rollback"): rows a checkpoint saw that the table no longer has.
	LostFrom, LostTo int64
}

func (e *BrokenError) Error() string {
	if e.Checkpoint != "" {
		return fmt.Sprintf("audit chain broken at seq %d (checkpoint %s): %s: %s", e.Seq, e.Checkpoint, e.Kind, e.Reason)
	}
	return fmt.Sprintf("audit chain broken at seq %d: %s: %s", e.Seq, e.Kind, e.Reason)
}

// Report summarises a successful verification.
type Report struct {
	Rows int64
	Head string // hex hash of the newest row; keep it elsewhere to anchor the chain
	// HeadSeq is the seq of the newest row.
	HeadSeq int64
	// Checkpoints is how many checkpoints the chain was checked against
	// (VerifyCheckpoints), and AnchoredSeq the seq of the newest one:
	// rows after it are not anchored yet.
	Checkpoints int
	AnchoredSeq int64
}

// Verify walks the whole chain oldest first, rehashing every row in Go
// (Row.Digest), and returns a *BrokenError for the first row whose content
// does not match its hash, whose prev_hash does not match the row before
// it, or whose seq leaves a gap. Alone it proves only that the table is
// self-consistent; VerifyCheckpoints anchors it.
func Verify(ctx context.Context, q *db.Queries) (Report, error) {
	return walk(ctx, q, 0, genesis, nil)
}

// walk verifies the rows after fromSeq, the first of which must link to
// prev, calling at (when set) with each row after it verified.
func walk(ctx context.Context, q *db.Queries, fromSeq int64, prev []byte, at func(Row) error) (Report, error) {
	const page = 1000
	var rep Report
	lastSeq := fromSeq
	for {
		rows, err := q.AuditPage(ctx, db.AuditPageParams{AfterSeq: lastSeq, Lim: page})
		if err != nil {
			return rep, fmt.Errorf("verify audit chain after seq %d: %w", lastSeq, err)
		}
		for _, dr := range rows {
			r := rowFrom(dr)
			if err := checkRow(r, lastSeq, prev); err != nil {
				return rep, err
			}
			if at != nil {
				if err := at(r); err != nil {
					return rep, err
				}
			}
			prev, lastSeq = r.Hash, r.Seq
			rep.Rows++
		}
		if len(rows) < page {
			rep.Head, rep.HeadSeq = hex.EncodeToString(prev), lastSeq
			return rep, nil
		}
	}
}

// checkRow checks one row against the seq and hash of the row before it.
func checkRow(r Row, lastSeq int64, prev []byte) error {
	switch {
	case r.Seq != lastSeq+1:
		return &BrokenError{Seq: r.Seq, Kind: "gap", Reason: fmt.Sprintf("row %d follows row %d", r.Seq, lastSeq)}
	case !bytes.Equal(r.PrevHash, prev):
		return &BrokenError{Seq: r.Seq, Kind: "link", Reason: fmt.Sprintf("prev_hash %x does not match the hash of row %d (%x)", r.PrevHash, lastSeq, prev)}
	}
	if d := r.Digest(); !bytes.Equal(d, r.Hash) {
		return &BrokenError{Seq: r.Seq, Kind: "content", Reason: fmt.Sprintf("the row's columns do not hash to its hash: stored %x, computed %x", r.Hash, d)}
	}
	return nil
}

func rowFrom(r db.AuditEvent) Row {
	return Row{
		Seq: r.Seq, At: r.At, ActorKind: r.ActorKind, Actor: r.Actor, Action: r.Action,
		TargetKind: r.TargetKind, Target: r.Target, Outcome: r.Outcome, Reason: r.Reason,
		Before: nilIfEmpty(r.Before), After: nilIfEmpty(r.After), PrevHash: r.PrevHash, Hash: r.Hash,
	}
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

func fromRow(r db.AuditEvent) Event {
	return Event{
		Seq:        r.Seq,
		At:         r.At,
		ActorKind:  r.ActorKind,
		Actor:      r.Actor,
		Action:     r.Action,
		TargetKind: r.TargetKind,
		Target:     r.Target,
		Outcome:    Outcome(r.Outcome),
		Reason:     r.Reason,
		Before:     r.Before,
		After:      r.After,
		Hash:       hex.EncodeToString(r.Hash),
	}
}

func marshal(v any) (json.RawMessage, error) {
	if v == nil {
		return nil, nil
	}
	if raw, ok := v.(json.RawMessage); ok {
		if len(raw) == 0 {
			return nil, nil
		}
		return raw, nil
	}
	return json.Marshal(v)
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Log reads the audit log through a pool.
type Log struct {
	pool *pgxpool.Pool
}

// Clip bounds s to n runes, marking the cut, for what an entry keeps of a
// caller's input: a refused request may carry a whole body of junk.
func Clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// NewLog returns a Log over pool.
func NewLog(pool *pgxpool.Pool) *Log { return &Log{pool: pool} }

// Append appends e in a transaction of its own (AppendAlone).
func (l *Log) Append(ctx context.Context, now time.Time, e Entry) (Event, error) {
	return AppendAlone(ctx, l.pool, now, e)
}

// List returns events newest first.
func (l *Log) List(ctx context.Context, f Filter) ([]Event, error) {
	return List(ctx, db.New(l.pool), f)
}

// Verify walks the whole chain; see the package function Verify.
func (l *Log) Verify(ctx context.Context) (Report, error) {
	return Verify(ctx, db.New(l.pool))
}

// Rows returns the rows from seq first to last, oldest first.
func Rows(ctx context.Context, q *db.Queries, first, last int64) ([]Row, error) {
	var out []Row
	for after := first - 1; after < last; {
		page, err := q.AuditPage(ctx, db.AuditPageParams{AfterSeq: after, Lim: int32(min(1000, last-after))})
		if err != nil {
			return nil, fmt.Errorf("read audit rows after seq %d: %w", after, err)
		}
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			out = append(out, rowFrom(r))
		}
		after = page[len(page)-1].Seq
	}
	return out, nil
}
