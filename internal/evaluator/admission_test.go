package evaluator_test

import (
	"testing"
	"time"

	"github.com/google/uuid"

	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
)

// An instance of a probe service that has served stays capacity across a
// restart that lost every observed window: a restarted evaluator reads its
// admission from the transitions on record and restates it in rotation
// (unknown: nobody has heard it since) or out of it as it was left; one
// that never succeeded still awaits its first success. Without this, a
// restart longer than the windows' retention would take every such
// instance out of the guard's count and out of every view.
func TestAdmissionSurvivesARestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, st.Options{})
	ids := make([]uuid.UUID, 3)
	for i, s := range f.web {
		ids[i] = uuid.MustParse(s)
	}
	for _, id := range ids {
		if v, _ := inRotation(t, f.Evaluator, "web", id); !v.Awaiting {
			t.Fatalf("a new instance of a probe service is %+v, want awaiting its first success", v)
		}
	}
	prober := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	ingest := func(ev *evaluator.Evaluator, id uuid.UUID, outcome string) {
		t.Helper()
		res, err := ev.Ingest(t.Context(), prober, []evaluator.Report{{InstanceID: id, Class: "probe", Outcome: outcome}})
		if err != nil || res.Accepted != 1 {
			t.Fatalf("ingest %s %s: %+v %v", id, outcome, res, err)
		}
	}
	// 0 and 1 succeed and enter rotation; then 1 fails hard and leaves it.
	// 2 never succeeds.
	ingest(f.Evaluator, ids[0], "success")
	ingest(f.Evaluator, ids[1], "success")
	f.Evaluator.EvaluateNow()
	f.Clock.Advance(time.Second)
	ingest(f.Evaluator, ids[1], "hard_failure")
	f.Evaluator.EvaluateNow()
	if v, in := inRotation(t, f.Evaluator, "web", ids[1]); in || v.Awaiting {
		t.Fatalf("instance 1 after a hard failure: %+v", v)
	}
	f.Evaluator.Stop() // flushes the transitions

	// Restart after the windows' retention: no evidence is replayed.
	f.Clock.Advance(10 * time.Minute)
	second := st.New(t, st.Options{Pool: f.Pool, Evaluator: func(c *evaluator.Config) { c.Now = f.Clock.Now }})
	g := &fixture{Stack: second, web: f.web}
	g.waitReady(t)
	if s := second.Evaluator.Stats(); s.WindowsReplayed != 0 {
		t.Fatalf("%d windows replayed, want none (past the retention)", s.WindowsReplayed)
	}
	v0, in := inRotation(t, second.Evaluator, "web", ids[0])
	if !in || v0.Awaiting || v0.State != eligibility.Unknown || v0.Weight != 1 {
		t.Fatalf("instance 0 (served before the restart) is %+v, want in rotation as unknown at weight 1", v0)
	}
	if v1, in := inRotation(t, second.Evaluator, "web", ids[1]); in || v1.Awaiting {
		t.Fatalf("instance 1 (out of rotation before the restart) is %+v, want out but counted", v1)
	}
	if v2, in := inRotation(t, second.Evaluator, "web", ids[2]); in || !v2.Awaiting {
		t.Fatalf("instance 2 (never succeeded) is %+v, want still awaiting", v2)
	}
	if v := g.verdict(t, "web", f.web[1]); v.State != "ineligible" {
		t.Fatalf("instance 1's verdict over HTTP: %+v", v)
	}
	// The restated out-of-rotation instance re-enters by the re-entry rules
	// on fresh evidence.
	for range 30 {
		f.Clock.Advance(time.Second)
		ingest(second.Evaluator, ids[1], "success")
		second.Evaluator.EvaluateNow()
		if _, in := inRotation(t, second.Evaluator, "web", ids[1]); in {
			return
		}
	}
	t.Fatalf("instance 1 did not re-enter rotation on 30 s of passing probes")
}
