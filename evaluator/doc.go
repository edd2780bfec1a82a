// Package evaluator is the embedded evaluation worker: it feeds health
// evidence into the pure eligibility core and hands verdicts and transitions
// to the next stage.
//
// One Evaluator owns one eligibility.Engine behind a mutex. Ingest attributes
// each report to an authenticated identity (ADR-15) against an in-memory copy
// of the registry (which instance belongs to which service, which prober is
// assigned to what), so the hot path does no database work; refused items are
// counted and explained per item, and never poison the rest of a batch.
//
// State classes (ADR-02): the engine's state is computed and lives only in
// memory. At start the evaluator rebuilds it from the registry plus the
// observed windows retained in PostgreSQL (an UNLOGGED table written by COPY
// every FlushEvery), and holds publication (Ready is false, the sink is not
// called) until the rebuild is done. Losing the windows costs confidence, not
// correctness: the instances come back as unknown and stay in rotation.
//
// Every eligibility transition after the rebuild is appended to the
// transitions table by a background writer; when PostgreSQL is away the
// writer buffers a bounded number and counts what it had to drop, and
// evaluation never waits for it.
package evaluator
