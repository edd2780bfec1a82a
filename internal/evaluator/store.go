package evaluator

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/fence"
)

type windowKey struct {
	id    uuid.UUID
	class eligibility.Class
}

// instanceWindows are an instance's counts in the current observed
// window, one per class, valid while gen is the evaluator's winGen: a
// flush moves winGen on, which empties every instance's counts at once
// without visiting them.
type instanceWindows struct {
	id     uuid.UUID
	gen    uint64
	counts [3]windowCounts
}

type windowCounts struct {
	successes, failures, hard, unobservable uint32
	// reps holds the first distinct reporters of the window; the rebuild
	// only needs to know whether one caller or several spoke.
	nrep uint8
	reps [4]eligibility.ReporterID
}

func (w *windowCounts) addReporter(r eligibility.ReporterID) {
	for _, x := range w.reps[:w.nrep] {
		if x == r {
			return
		}
	}
	if int(w.nrep) < len(w.reps) {
		w.reps[w.nrep] = r
		w.nrep++
	}
}

// countWindow adds one accepted sample of the instance whose windows iw
// are to the current observed window. Called with e.mu held.
func (e *Evaluator) countWindow(iw *instanceWindows, s eligibility.Sample) {
	if iw.gen != e.winGen {
		// Its first sample since the flush (winGen starts at 1, so also
		// its first ever).
		iw.gen, iw.counts = e.winGen, [3]windowCounts{}
		e.windows = append(e.windows, iw)
	}
	w := &iw.counts[s.Class]
	switch {
	case s.Successes > 0 || s.Failures > 0:
		w.successes += s.Successes
		w.failures += s.Failures
	case s.Outcome == eligibility.Success:
		w.successes++
	case s.Outcome == eligibility.Failure:
		w.failures++
	case s.Outcome == eligibility.HardFailure:
		w.hard++
	case s.Outcome == eligibility.Unobservable:
		w.unobservable++
	}
	w.addReporter(s.Reporter)
}

// pendingWindow is an observed window to write, with the tenure under
// which this replica decided to write it (fence.Fence.ClaimUnlessOwned).
type pendingWindow struct {
	db.ObservedWindowsInsertParams
	tenure fence.Token
}

// flushWindows writes the windows counted since the last flush with COPY,
// after any kept from flushes that failed, and prunes what the rebuild will
// never read again. Windows that cannot be written are kept (bounded by
// MaxPendingWindows, the oldest dropped first) and written by a later
// flush, once PostgreSQL is back.
//
// Who writes a window is decided when the flush takes it (Config.Fence):
// the service's owner, under its tenure, or anyone while no other
// replica is known to own it. An owner's windows are written in the
// transaction that checks its tenure, so an owner deposed since the
// decision (a pause) writes none of them; they are dropped and counted,
// not kept (the new owner writes its own, counted from the same
// mirrored evidence).
//
// A write that fails ambiguously (the reply lost after the COPY committed)
// is written again by the next flush; observed_windows has no key, so the
// rebuild then counts that window twice. Observed state is lossy by
// contract (ADR-02), and a doubled window is a smaller error than a lost
// outage's worth of them.
func (e *Evaluator) flushWindows(ctx context.Context) error {
	e.flushMu.Lock()
	defer e.flushMu.Unlock()
	now := e.cfg.Now()
	e.mu.Lock()
	// The counts are copied out under the lock: once winGen moves on, the
	// next sample of an instance starts its next window in place.
	counted, start := e.windows, e.winStart
	e.windows, e.winStart = make([]*instanceWindows, 0, len(counted)), now
	e.winGen++
	type flushed struct {
		windowKey
		windowCounts
		tenure fence.Token
	}
	windows := make([]flushed, 0, len(counted))
	for _, iw := range counted {
		// Only the owner, or anyone while no other replica is known to
		// own the service, writes a window; one unknown here (ended since)
		// is written unfenced, as alone.
		var t fence.Token
		if in, ok := e.instances[iw.id]; ok {
			var writes bool
			if t, writes = e.cfg.Fence.ClaimUnlessOwned(in.service); !writes {
				continue
			}
		}
		for cl := range iw.counts {
			if iw.counts[cl].nrep > 0 {
				windows = append(windows, flushed{windowKey{iw.id, eligibility.Class(cl)}, iw.counts[cl], t})
			}
		}
	}
	e.mu.Unlock()
	if start.IsZero() {
		start = now.Add(-e.cfg.FlushEvery)
	}
	batch := e.pendingWindows
	e.pendingWindows = nil
	for _, w := range windows {
		batch = append(batch, pendingWindow{ObservedWindowsInsertParams: db.ObservedWindowsInsertParams{
			InstanceID: w.id, Class: int16(w.class), WindowStart: start, WindowEnd: now,
			Successes: int32(w.successes), Failures: int32(w.failures), HardFailures: int32(w.hard),
			Unobservable: int32(w.unobservable), Reporters: int32(max(w.nrep, 1)), Writer: e.cfg.Replica,
		}, tenure: w.tenure})
	}
	// What the prune below would delete at once is not worth writing.
	horizon := now.Add(-2 * e.cfg.Retention)
	stale := 0
	for stale < len(batch) && batch[stale].WindowEnd.Before(horizon) {
		stale++
	}
	if stale > 0 {
		e.metrics.windowsDropped.Add(float64(stale))
		batch = batch[stale:]
	}
	for len(batch) > 0 {
		n := min(len(batch), windowChunk)
		cctx, cancel := context.WithTimeout(ctx, e.cfg.DBTimeout)
		written, deposed, err := e.writeWindows(cctx, batch[:n])
		cancel()
		if err != nil {
			e.keepWindows(batch)
			return fmt.Errorf("write %d observed windows (%d kept for the next flush): %w", n, len(e.pendingWindows), err)
		}
		e.metrics.windowsWritten.Add(float64(written))
		e.cfg.Fence.Dropped("observed-windows", deposed)
		batch = batch[n:]
	}
	e.keepWindows(nil)
	pctx, cancel := context.WithTimeout(ctx, e.cfg.DBTimeout)
	defer cancel()
	if _, err := db.New(e.cfg.Pool).ObservedWindowsPrune(pctx, horizon); err != nil {
		return fmt.Errorf("prune observed windows: %w", err)
	}
	return nil
}

// writeWindows writes one chunk in one transaction: each tenure the chunk
// was decided under is checked once, first (fence.Fence.CheckAll), the
// windows of tenures that ended are left out (deposed), the rest are
// copied.
func (e *Evaluator) writeWindows(ctx context.Context, chunk []pendingWindow) (written, deposed int, err error) {
	err = db.WithTx(ctx, e.cfg.Pool, func(q *db.Queries) error {
		tenures := make([]fence.Token, len(chunk))
		for i, w := range chunk {
			tenures[i] = w.tenure
		}
		ended, err := e.cfg.Fence.CheckAll(ctx, q, tenures)
		if err != nil {
			return err
		}
		rows := make([]db.ObservedWindowsInsertParams, 0, len(chunk))
		written, deposed = 0, 0
		for _, w := range chunk {
			if ended[w.tenure] {
				deposed++
				continue
			}
			rows = append(rows, w.ObservedWindowsInsertParams)
		}
		if len(rows) == 0 {
			return nil
		}
		n, err := q.ObservedWindowsInsert(ctx, rows)
		written = int(n)
		return err
	})
	return written, deposed, err
}

// windowChunk is how many windows one COPY writes: a region's worth of
// windows kept through an outage goes out in pieces, each within the
// deadline, and what was written stays written if a later piece fails.
const windowChunk = 20_000

// keepWindows holds unwritten windows (oldest first) for the next flush,
// dropping the oldest beyond MaxPendingWindows. Called with flushMu held.
func (e *Evaluator) keepWindows(batch []pendingWindow) {
	if over := len(batch) - e.cfg.MaxPendingWindows; over > 0 {
		e.metrics.windowsDropped.Add(float64(over))
		batch = batch[over:]
	}
	if len(batch) == 0 {
		batch = nil // let a region's worth of kept windows go
	}
	e.pendingWindows = batch
	e.metrics.windowsPending.Set(float64(len(batch)))
}

// replayWindows feeds the retained windows into the engine, oldest first,
// as aggregates stamped at each window's end. It reads in pages so a
// region's worth of windows never sits in memory at once.
func (e *Evaluator) replayWindows(ctx context.Context) (int, error) {
	const page = 50_000
	since := e.cfg.Now().Add(-e.cfg.Retention)
	replayer := e.internReporter("system:rebuild")
	e.replayer = replayer
	// The replayed probe windows are the instances' history, not a prober
	// (they would contradict a live prober's hard failure as a healthy
	// peer until they fell silent): the first live sample supersedes them.
	e.mu.Lock()
	e.engine.SetHistoryReporter(replayer)
	e.mu.Unlock()
	q := db.New(e.cfg.Pool)
	params := db.ObservedWindowsSinceParams{Since: since, AfterEnd: since, Lim: page}
	n := 0
	for {
		rows, err := q.ObservedWindowsSince(ctx, params)
		if err != nil {
			return n, fmt.Errorf("read observed windows: %w", err)
		}
		e.mu.Lock()
		for _, w := range rows {
			e.replayWindow(w, replayer)
		}
		e.mu.Unlock()
		n += len(rows)
		if len(rows) < page {
			return n, nil
		}
		last := rows[len(rows)-1]
		params.AfterEnd, params.AfterID, params.AfterClass = last.WindowEnd, last.InstanceID, last.Class
	}
}

// replayWindow applies one window. Called with e.mu held.
func (e *Evaluator) replayWindow(w db.ObservedWindowsSinceRow, replayer eligibility.ReporterID) {
	if _, ok := e.instances[w.InstanceID]; !ok {
		return
	}
	s := eligibility.Sample{
		Instance: eligibility.InstanceID(w.InstanceID), Class: eligibility.Class(w.Class),
		At: w.WindowEnd, Reporter: replayer,
	}
	if w.HardFailures > 0 {
		s.Outcome = eligibility.HardFailure
		_ = e.engine.Observe(s)
	}
	switch {
	case w.Successes > 0 || w.Failures > 0:
		s.Outcome, s.Successes, s.Failures = eligibility.Success, uint32(w.Successes), uint32(w.Failures)
		_ = e.engine.Observe(s)
	case w.Unobservable > 0:
		s.Outcome = eligibility.Unobservable
		_ = e.engine.Observe(s)
	}
}

// restoreQuarantines hands the engine back the newest quarantine of every
// active instance that has not ended, or ended recently enough to set the
// next one's step (see doc.go). Quarantines of instances the registry no
// longer holds as active are skipped.
func (e *Evaluator) restoreQuarantines(ctx context.Context) (int, error) {
	now := e.cfg.Now()
	since := now.Add(-e.engine.Options().QuarantineForgive)
	rows, err := db.New(e.cfg.Pool).TransitionsLatestQuarantines(ctx, since)
	if err != nil {
		return 0, fmt.Errorf("read quarantines: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, r := range rows {
		if _, ok := e.instances[r.InstanceID]; !ok {
			continue
		}
		q := eligibility.Quarantine{Start: r.At, Until: r.QuarantinedUntil, Step: int(r.QuarantineStep)}
		if q.Step < 1 {
			// The writer always records a step with an end; a row without
			// one still holds its instance out, escalating from the first.
			q.Step = 1
		}
		if err := e.engine.RestoreQuarantine(eligibility.InstanceID(r.InstanceID), q, now); err != nil {
			e.log.Warn("restore quarantine", "instance", r.InstanceID, "err", err)
			continue
		}
		if q.Until.After(now) {
			n++
			e.quarantined[r.InstanceID] = quarantineNote{at: r.At, until: r.QuarantinedUntil, reason: "quarantine restored after a restart"}
		}
	}
	return n, nil
}

// transitionWriter appends transitions to PostgreSQL in batches, off the
// evaluation path. While the database is away it keeps at most limit
// transitions and counts the ones it drops.
type transitionWriter struct {
	pool    *pgxpool.Pool
	fence   *fence.Fence
	limit   int
	timeout time.Duration // bounds one COPY
	up      func() bool   // whether PostgreSQL answers; no tries while not
	metrics *metrics
	log     *slog.Logger

	mu      sync.Mutex
	pending []fencedTransition
	wake    chan struct{}
}

// fencedTransition is a transition to record, with the tenure under which
// this replica decided to record it (see Evaluator.publish).
type fencedTransition struct {
	eligibility.Transition
	tenure fence.Token
}

func newTransitionWriter(pool *pgxpool.Pool, f *fence.Fence, limit int, timeout time.Duration, up func() bool, m *metrics, log *slog.Logger) *transitionWriter {
	if up == nil {
		up = func() bool { return true }
	}
	return &transitionWriter{pool: pool, fence: f, limit: limit, timeout: timeout, up: up, metrics: m, log: log, wake: make(chan struct{}, 1)}
}

func (w *transitionWriter) add(ts []fencedTransition) {
	w.mu.Lock()
	room := w.limit - len(w.pending)
	if room < len(ts) {
		w.metrics.transitionsDropped.Add(float64(len(ts) - max(room, 0)))
		ts = ts[:max(room, 0)]
	}
	w.pending = append(w.pending, ts...)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// requeue puts a failed batch back in front, without waking the writer: the
// retry ticker paces the next attempt.
func (w *transitionWriter) requeue(batch []fencedTransition) {
	w.mu.Lock()
	defer w.mu.Unlock()
	merged := append(batch, w.pending...)
	if over := len(merged) - w.limit; over > 0 {
		w.metrics.transitionsDropped.Add(float64(over))
		merged = merged[over:] // drop the oldest
	}
	w.pending = merged
}

func (w *transitionWriter) run(ctx context.Context) {
	retry := time.NewTicker(time.Second)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			w.flush(fctx)
			cancel()
			return
		case <-w.wake:
		case <-retry.C:
		}
		if w.up() {
			w.flush(ctx)
		}
	}
}

func (w *transitionWriter) flush(ctx context.Context) {
	w.mu.Lock()
	batch := w.pending
	w.pending = nil
	w.mu.Unlock()
	// In pieces, each within the deadline: what an outage held back goes
	// out even when all of it would take longer than one deadline, and
	// what was written stays written if a later piece fails.
	for len(batch) > 0 {
		n := min(len(batch), transitionChunk)
		fctx, cancel := context.WithTimeout(ctx, w.timeout)
		written, deposed, err := w.write(fctx, batch[:n])
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				w.log.Warn("write transitions; keeping them for the next try", "count", len(batch), "err", err)
			}
			w.requeue(batch)
			return
		}
		w.metrics.transitionsWritten.Add(float64(written))
		if deposed > 0 {
			// Recorded by the new owner, which computed them too.
			w.fence.Dropped("transitions", deposed)
		}
		batch = batch[n:]
	}
}

// write appends one chunk in one transaction, leaving out the transitions
// decided under a tenure that has ended (deposed).
func (w *transitionWriter) write(ctx context.Context, chunk []fencedTransition) (written, deposed int, err error) {
	err = db.WithTx(ctx, w.pool, func(q *db.Queries) error {
		tenures := make([]fence.Token, len(chunk))
		for i, t := range chunk {
			tenures[i] = t.tenure
		}
		ended, err := w.fence.CheckAll(ctx, q, tenures)
		if err != nil {
			return err
		}
		rows := make([]db.TransitionsInsertParams, 0, len(chunk))
		written, deposed = 0, 0
		for _, t := range chunk {
			if ended[t.tenure] {
				deposed++
				continue
			}
			rows = append(rows, transitionRow(t.Transition))
		}
		if len(rows) == 0 {
			return nil
		}
		n, err := q.TransitionsInsert(ctx, rows)
		written = int(n)
		return err
	})
	return written, deposed, err
}

func transitionRow(t eligibility.Transition) db.TransitionsInsertParams {
	var hist json.RawMessage
	if len(t.History) > 0 {
		hist, _ = json.Marshal(historyOf(t.History))
	}
	row := db.TransitionsInsertParams{
		InstanceID: uuid.UUID(t.Instance), Service: t.Service, FromState: t.From.String(), ToState: t.To.String(),
		Weight: t.Weight, At: t.At, Reason: t.Reason, History: hist,
	}
	if !t.QuarantinedUntil.IsZero() {
		until := t.QuarantinedUntil
		row.QuarantinedUntil = &until
		row.QuarantineStep = int16(min(t.QuarantineStep, math.MaxInt16))
	}
	return row
}

// transitionChunk is how many transitions one COPY writes.
const transitionChunk = 10_000

// historyEntry is a transition in a quarantine's attached history.
type historyEntry struct {
	From   string    `json:"from"`
	To     string    `json:"to"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

func historyOf(ts []eligibility.Transition) []historyEntry {
	out := make([]historyEntry, len(ts))
	for i, t := range ts {
		out[i] = historyEntry{From: t.From.String(), To: t.To.String(), At: t.At, Reason: t.Reason}
	}
	return out
}

// admissionBatch bounds the ids of one admissions query.
const admissionBatch = 10_000

// restoreAdmissions hands the engine back, for every active instance that
// would otherwise start awaiting its first success, the fact that it had
// been in rotation before the restart: the newest transition on record
// says so and in which state it was left (see
// eligibility.Engine.RestoreAdmission). Without it a restart would take
// every instance of a probe or readiness service out of the guard's
// count until it is heard again. Expired instances kept for the guard are
// settled the same way. It returns how many instances were restored.
func (e *Evaluator) restoreAdmissions(ctx context.Context) (int, error) {
	return e.restoreAdmissionsOf(ctx, nil)
}

// RestoreAdmissions is the rebuild's restoreAdmissions for the services
// of (all when of is nil), run again when this replica is dealt them
// (publisher.Config.Adopting): it has kept their state from their owner's
// windows, in which an instance the owner admitted may still await its
// first success here (a window read before the instance was known, a
// write the follower missed), and the owner's record of admitting it is
// in PostgreSQL. It returns how many instances it restored.
func (e *Evaluator) RestoreAdmissions(ctx context.Context, of func(service string) bool) (int, error) {
	return e.restoreAdmissionsOf(ctx, of)
}

func (e *Evaluator) restoreAdmissionsOf(ctx context.Context, of func(service string) bool) (int, error) {
	now := e.cfg.Now()
	// of is asked once per service, and not under e.mu: it is another
	// component's (the ownership manager's), with its own lock.
	var keep map[string]bool
	if of != nil {
		e.mu.Lock()
		keep = make(map[string]bool, len(e.services))
		for name := range e.services {
			keep[name] = false
		}
		for _, in := range e.instances {
			keep[in.service] = false
		}
		for name := range e.expired {
			keep[name] = false
		}
		e.mu.Unlock()
		for name := range keep {
			keep[name] = of(name)
		}
	}
	e.mu.Lock()
	var ids []uuid.UUID
	for id, info := range e.instances {
		if keep != nil && !keep[info.service] {
			continue
		}
		if r, ok := e.engine.Routing(eligibility.InstanceID(id), now); ok && r.Awaiting {
			ids = append(ids, id)
		}
	}
	for service, kept := range e.expired {
		if keep != nil && !keep[service] {
			continue
		}
		for id, x := range kept {
			if x.awaiting {
				ids = append(ids, id)
			}
		}
	}
	e.mu.Unlock()
	q := db.New(e.cfg.Pool)
	n := 0
	for len(ids) > 0 {
		batch := ids[:min(len(ids), admissionBatch)]
		ids = ids[len(batch):]
		rows, err := q.TransitionsLatestFor(ctx, batch)
		if err != nil {
			return n, fmt.Errorf("read admissions: %w", err)
		}
		e.mu.Lock()
		for _, r := range rows {
			if info, ok := e.instances[r.InstanceID]; ok {
				var last eligibility.State
				if err := last.UnmarshalText([]byte(r.ToState)); err != nil {
					last = eligibility.Unknown // unreadable: no evidence of failure
				}
				if err := e.engine.RestoreAdmission(eligibility.InstanceID(r.InstanceID), last, r.At, now); err != nil {
					e.log.Warn("restore admission", "instance", r.InstanceID, "service", info.service, "err", err)
					continue
				}
				n++
				continue
			}
			for _, kept := range e.expired {
				if x, ok := kept[r.InstanceID]; ok {
					x.awaiting = false
					kept[r.InstanceID] = x
					n++
				}
			}
		}
		e.mu.Unlock()
	}
	return n, nil
}
