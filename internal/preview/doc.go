// Package preview answers "what if this service had had another health
// contract?": it replays the observed windows muster holds for
// a service through the evaluation core twice, once under the contract in
// force and once under a proposed one, and reports side by side how many
// instances each would have removed, degraded or left unknown, when,
// whether the minimum-healthy-fraction guard would have tripped, and which
// instances the two disagree on.
//
// Like the eligibility core and the assembler it is a function of its
// input: no I/O, no goroutines, no clock. Run builds a fresh
// eligibility.Engine for each contract, so the live engine, its verdicts
// and the views built from them are never touched; the evaluator hands it
// the windows and the instances (Evaluator.PreviewContract).
//
// # The replay
//
// Every instance starts at From as the rebuild after a restart restates
// it: one that has served (not Awaiting) in rotation with its health
// unknown (eligibility.Engine.RestoreAdmission), one awaiting its first
// success out of rotation, not counted by the guard. Windows are fed in
// order of their end, each as an aggregate sample stamped at its end, as
// the rebuild replays them, and the engine is evaluated at every window
// end and every Step (1 s) in between, so timers (silence, dwell,
// quarantine ends) fall due when they would have.
//
// Two departures from the rebuild's replay, both because a preview weighs
// contracts against evidence rather than restarting a region:
//
//   - A window counts its distinct reporters (up to 4). The rebuild
//     replays a passive window as one caller's, so replayed passive
//     evidence alone can never remove (MinPassiveReporters is 2 by
//     default). The preview spreads a passive window's outcomes evenly
//     over that many callers, so a contract's MinPassiveReporters and
//     removal threshold act on passive evidence as they did live. The
//     spread is an approximation: callers that saw different failure
//     rates are averaged.
//   - Probe and self windows are replayed under one reporter per class;
//     live prober identities are not retained in the windows, so the
//     preview cannot tell two probers apart (nor one suspect).
//
// # What is counted
//
// Removed counts instances taken out of rotation at least once (a
// transition into ineligible from a state in rotation; a quarantine is
// one), Degraded those degraded at least once, Unknown those left unknown
// at To. Final and Peak are counts by state at To and when the most were
// out of rotation at once. The guard is the assembler's (assembler.Tripped
// on the same Routable and Counted rule) per zone with the contract's
// minimum healthy fraction; overrides and lease expiries are not part of
// the replay. Differences lists, by instance id, the instances whose
// final state, worst state (eligible < unknown < degraded < ineligible) or
// removal count differ between the two contracts, at most MaxDiffs of
// them (DiffsTotal says how many there were).
package preview
