// Package eligibility is muster's pure evaluation core: it fuses health
// evidence about instances into one eligibility verdict per instance
// (ADR-04 to 07, 09, 12, 16). It imports nothing from muster, does no I/O,
// starts no goroutines and never reads the clock: every time is passed in.
// The evaluator owns an Engine, serialises calls to it, feeds it samples
// (Observe), calls Tick on a cadence and publishes the transitions.
//
// # Evidence and the decaying failure rate
//
// Three classes: Probe (active prober), Self (the instance's own report)
// and Passive (outcomes callers observed). For each instance and class the
// engine keeps a decaying failure rate with the contract's half-life H:
//
//	f ← f·2^(−Δt/H) + failures,  n ← n·2^(−Δt/H) + samples,  rate = f/n
//
// Δt is the time since the track's previous sample, so a sample is credited
// with the gap before it and the rate tracks failure *time*, not sample
// count. Decay alone leaves f/n unchanged: the rate moves only when
// evidence arrives. From a clean track, every sample failing at period p
// gives 1 − 2^(−k·p/H) after k samples, so the removal threshold R is
// crossed (ceil(H·log2(1/(1−R))/p) − 1)·p < H·log2(1/(1−R)) after the first
// failing sample: under 4 s with the defaults (H 4 s, R 0.5), and at the
// first failing probe at the default 5 s interval (1 − 2^(−5/4) = 0.58).
//
// Passive evidence is weighted by reporter population, not volume: each
// instance keeps up to 8 recent reporters (a new one evicts the least
// recently heard), each with its own track, and the class rate is the mean
// of the reporters' rates inside the silence window. A reporter whose
// decayed volume is below Options.MinReporterVolume (3) counts in
// proportion to it, so one caller's single failed request is not a 100%
// vote. A thousand reports from one caller still count as one caller, and
// the contract's MinPassiveReporters (default 2, 1 to 8) is the population
// passive needs to act at all:
//
//   - passive is primary only with at least MinPassiveReporters reporters
//     inside the window (besides the traffic threshold below);
//   - passive counts as failing (may remove, as primary or through the
//     mean) only when at least MinPassiveReporters reporters inside the
//     window each have a rate at or above the removal threshold, or when
//     another class fails too (corroboration);
//   - passive contradicts another class (see States) only with at least
//     MinPassiveReporters reporters speaking.
//
// A passive HardFailure (a caller's connection refused) is one caller's
// full vote: that reporter's track is forced to rate 1 with at least
// MinReporterVolume of weight. It never takes the hard-failure fast path:
// any identity may report passive evidence, so one caller alone must not be
// able to remove an instance.
//
// Probe evidence is kept per prober: each instance keeps up to 3 probers
// (a target has one or two; the least recently heard is evicted), each
// with its own track, and the probe class rate is the mean of the rates of
// the probers inside the silence window whose evidence counts (a suspect
// prober's does not; see Probers). Self is one track: the instance's own.
//
// # Fusion and the primary class
//
// Over the speaking (non-silent) classes the fused rate is
//
//	fused = max(weighted mean of class rates, rate of the primary class)
//
// with the contract's per-class weights. A silent or absent class is left
// out of both terms: never read as negative or positive. The primary class
// is Passive while the instance's caller traffic (decayed passive volume ×
// ln2/H, in requests/s) is at or above PassivePrimaryRPS (it stays primary
// down to 0.8× that, so traffic at the threshold does not flip it) and at
// least MinPassiveReporters callers speak, else Probe, else Self. Below the
// threshold, passive's weight in the mean is scaled by traffic/threshold,
// and the evidence is reported single-class (Verdict.SingleClass) when
// fewer than two classes count as sufficient. While passive is primary
// probing drops to a confirmation cadence, so the probe class's silence
// window is stretched by ConfirmationMultiple (6).
//
// The fused rate says how bad the evidence is; whether it may remove also
// depends on which classes fail. A class fails when it speaks and its rate
// is at or above RemovalThreshold (passive: with its population, above).
// Removal needs at least one failing class, and a failure from one class
// alone that another class or a peer prober contradicts does not remove
// (States, below). Passive failing as primary is never contradicted: it is
// already the word of MinPassiveReporters callers, and grey failure is
// exactly what a probe cannot see and what a process reports healthy
// through (ADR-04). So grey failure, seen only by callers, removes when
// passive is primary; a probe or a self-report failing alone removes only
// when nothing healthy speaks against it.
//
// # States and thresholds
//
// Unknown, Eligible, Degraded (weight in (0,1)) and Ineligible; all but
// Ineligible are in rotation.
//
//   - Removal: fused ≥ RemovalThreshold with at least one failing class,
//     but only on fresh failure evidence (a failure sample since the last
//     evaluation, not from a suspect prober). A class falling silent can
//     raise the fused rate; it never triggers removal.
//   - Contradiction (ADR-04: a prober partition degrades confidence, it
//     does not drain a healthy fleet): when removal would be driven by one
//     class (exactly one failing class and fused ≥ RemovalThreshold, or a
//     HardFailure sample from probe or self), no other class fails, and
//     another present class is speaking (inside its silence window) and
//     healthy (rate below the effective re-entry threshold; passive with at
//     least MinPassiveReporters callers speaking; self not naming an unready
//     dependency), or, for probe, another prober of the instance is, the
//     instance is not removed. It becomes (or stays) Degraded at
//     Options.DependencyWeight (0.5) × its weight, with a reason naming the
//     failing class, its prober(s) and what contradicts it: "probe failing
//     (prober prober-az1) contradicted by self and passive: degraded".
//     Degraded is in rotation, so this is no eligibility change for the
//     flap count. A contradicted hard failure latches nothing (its track
//     stays at rate 1). When the contradiction ends (the other classes fail
//     too, go silent or leave the healthy band) the normal rules apply
//     again: the next fresh failure evidence removes (until then the
//     instance stays Degraded, saying so), and a failure that clears
//     returns it to Eligible. Passive failing as primary, HardFail (out-of-band: lease,
//     process) and an unready dependency are never contradicted.
//   - Re-entry: fused < ReentryThreshold (strictly lower than removal;
//     effective floor 0.001, since a remembered failure never decays to 0)
//     and at least MinDwell after removal. The engine uses
//     max(MinDwell, soft detection time) as the dwell, so re-entry is never
//     faster than removal for any valid contract.
//   - Hard failure (a probe or self HardFailure sample: connection refused;
//     HardFail: lease expired, process gone) bypasses the decay: the
//     reporter's track is forced to rate 1 (keeping its weight, so undoing
//     it takes as much evidence as a sustained soft failure) and the
//     instance is removed at the next Tick, with the transition stamped at
//     the Tick time and FirstFailureAt at the failure, unless it is
//     contradicted (above; HardFail never is). It stays out until a later
//     success and the normal re-entry rules. A sample of the same reporter
//     older than the hard failure, arriving after it (forwarded evidence
//     comes hard failures first), is superseded and not counted. A
//     passive HardFailure is a strong vote, not this path (Evidence,
//     above).
//   - Silence: a class with no success or failure sample for
//     SilenceMultiple × Interval (3 × 5 s = 15 s by default; two lost or late
//     samples are tolerated, a third is not) is silent, measured from no
//     earlier than the service's HoldSilence (a service another replica
//     evaluates, heard of late through its windows). An instance whose
//     present classes are all silent is Unknown and stays in rotation. An
//     Ineligible instance that goes silent stays Ineligible: silence is not
//     evidence of recovery either.
//   - Unobservable samples ("I could not observe") are counted and shown
//     (ClassSummary.Unobservable, a reason) but are neither failures nor
//     samples: a class hearing only them goes silent.
//   - Unknown → Ineligible needs corroboration: at least two failing
//     classes. A single class, even reporting hard failures, leaves the
//     instance Unknown with a reason; only HardFail (out-of-band: lease,
//     process) skips this. (A failure that another class contradicts makes
//     an Unknown instance Degraded, as above.) An instance RestoreAdmission
//     restated from a recorded eligible or degraded state is Unknown only
//     because this engine has not heard it yet: for one silence window
//     after the restore it is removed as that state would be.
//   - A new instance of a service with a readiness signal (readiness or
//     probe capability) starts Ineligible and enters on its first success
//     (a Self success if RequireReadiness) once fused < removal; one without
//     enters Eligible with HealthKnown false (ADR-16).
//
// # Dependencies (ADR-06)
//
// A self-report may name a degraded dependency; a self-report naming none
// clears it, and so does the self class falling silent. Informational
// changes nothing; Weight (the default, and for undeclared names) makes
// the instance Degraded at DependencyWeight (0.5) × its weight; Unready
// makes it Ineligible, and counts as the self class failing for the
// corroboration rule. Shared+Unready is refused upstream and treated as
// Weight here.
//
// # Damping budget
//
// With the platform defaults a genuine soft failure (every sample of every
// present class failing; passive from at least MinPassiveReporters callers)
// is removed at most 5 s after its first failing sample: the primary class
// crosses 0.5 at its own first failing sample (probe or self at a 5 s
// interval) or within H = 4 s plus one reporting period (passive, flushed at
// least every second), and a class that contradicts it stops doing so at
// its own first failing sample (probe, self) or once its rate reaches the
// re-entry threshold, H·log2(1/0.8) ≈ 1.3 s plus a reporting period
// (passive); both happen within 5 s of the first failing sample. A hard
// failure from the only class present (probe or self) is removed at 0 s;
// with other classes healthy at that moment it is held (Degraded) until
// they fail too, within the same 5 s. Transition FirstFailureAt records the
// first failed sample of the episode (over all classes: a class's clean
// success ends only its own part), so the evaluator can report
// At − FirstFailureAt as the damping cost.
//
// # Flap quarantine (ADR-09)
//
// Eligibility changes (crossings into or out of rotation; not the first
// admission, not Unknown↔Eligible) are remembered per instance. The change
// that would make more than FlapThreshold (4) within FlapWindow (10 min)
// starts a quarantine: a removal goes ahead, a re-entry is held. The
// instance is held Ineligible for QuarantineBase (1 min), doubling per
// repeat up to QuarantineCap (30 min): 1, 2, 4, 8, 16, 30, 30. A quarantine
// starting QuarantineForgive (1 h) after the previous one ended starts again
// at 1 min. The quarantine transition carries History, QuarantinedUntil and
// QuarantineStep; the remembered changes are then cleared. ServiceStats
// reports changes in the window, the flap rate per instance-hour and
// quarantine counts.
//
// A quarantine is computed state, yet it must outlive the process that
// computed it, or a restart would put a known-bad instance back into
// rotation and start its next quarantine at 1 min again. RestoreQuarantine
// takes the last quarantine's start, end and step (all on its transition)
// and holds the instance out until the end as the live quarantine did; the
// next quarantine escalates from that step, with the same forgiveness.
// Changes remembered since the last quarantine are not restored: after a
// restart the flap window starts empty.
//
// # Slow start (ADR-12)
//
// An instance entering rotation (new or re-entering) is published at
//
//	weight = max(1, min(⌊steps·t/SlowStart⌋, ⌊steps·s⌋)) / steps
//	s = (1 − fused) / (1 − ReentryThreshold), capped at 1
//
// t the time in rotation, steps SlowStartSteps (10): at most `steps` weight
// changes per ramp, monotone under all-success, 1 exactly at SlowStart
// (SlowStart 0: 1 at once). Degraded multiplies it by DependencyWeight.
// Weight-only changes are transitions with From == To.
//
// # Probers: outages and suspicion (ADR-05)
//
// AssignProber says which instances a prober should report; NameReporter
// gives it the name reasons use (the evaluator passes the prober's
// subject), else it appears by number. A prober that observes none of its
// targets for ProberSilence (15 s) is a prober outage (ProberOutages;
// Unobservable set if it is still reporting, only that it cannot see):
// attributed to the prober, while its targets' probe class simply goes
// silent, so they become Unknown, not Ineligible, and their verdict names
// the prober.
//
// A broken prober may report failure instead of going silent. For each
// assigned prober the engine counts, over its targets as last evaluated,
// those it reports on (a sample inside the window), those it reports
// failing (its own rate at or above removal) and of those the contradicted
// ones (no other class failing, and another class or a peer prober of the
// target healthy, as in States). A prober contradicted on at least
// Options.SuspectMinTargets (3) targets and at least SuspectFraction (0.5)
// of those it reports on is suspect (ProberSuspects, ProberStats, with
// per-service counts). Its samples are still recorded on its own track but
// stop counting, as an outage's silence does: its targets' probe class is
// silent from it (Unknown or as the other evidence says, never removed by
// it), its failures are no fresh failure evidence and its hard failures
// latch nothing. It stays suspect while it reports failure on that many of
// its targets, even if what contradicted it falls silent (an ingest outage
// must not hand the fleet back to a broken prober), and is cleared when it
// stops failing. Suspicion is decided at the start of a Tick from the
// previous evaluations, so for one Tick the targets are Degraded by
// contradiction before the prober's evidence is set aside.
//
// # Cost
//
// Observe is O(1) and allocation-free for a known instance (one index
// lookup, a scan of 8 passive or 3 probe reporter ids, one or two exp2, and
// for probe one map lookup for the prober). Tick visits every instance but
// evaluates only those with new evidence or a due timer (silence, dwell,
// quarantine end, slow-start step, and at least once per contract
// interval); a prober's counts change only when one of its slots' flags
// does, and a change of suspicion re-evaluates its targets. Instance state
// is under 1.3 KiB for all three classes (see TestMemoryPerInstanceClass
// for the measured figure).
package eligibility
