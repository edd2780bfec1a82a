package evaluator_test

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	st "github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/wait"
)

// TestAFollowerKeepsWarmFromTheOwnersWindows: a replica that does not
// evaluate web (its evidence goes to web's owner) takes web's state from
// the windows the owner writes: after the owner saw web[0] fail and
// flushed, the follower holds web[0] ineligible and the others eligible,
// as the owner does, without one sample of web reaching it. It applies
// each window once, never the windows it wrote itself, and nothing of a
// service it evaluates (whose evidence comes to it live).
//
// The follower's clock may be far from the owner's (here 5 minutes
// ahead, beyond the 90 s after which an instance is silent): a window is
// placed at its write time on the follower's clock, so what the owner saw
// a moment ago is a moment old at the follower too.
func TestAFollowerKeepsWarmFromTheOwnersWindows(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{0, 5 * time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			followerKeepsWarm(t, skew)
		})
	}
}

// ownerAndFollower starts an owner (newFixture, replica "owner") and a
// follower on its database (replica "follower") that does not evaluate
// web, reads with a 1 ms margin and takes the owner's clock; more sets
// the rest of the follower's configuration, given the owner.
func ownerAndFollower(t *testing.T, more func(*evaluator.Config, *fixture)) (*fixture, *st.Stack) {
	t.Helper()
	f := newFixture(t, st.Options{Evaluator: func(c *evaluator.Config) { c.Replica = "owner" }})
	follower := st.New(t, st.Options{Pool: f.Pool, Evaluator: func(c *evaluator.Config) {
		c.Now = f.Clock.Now
		c.Replica = "follower"
		c.Evaluates = func(service string) bool { return service != "web" }
		c.FollowMargin = time.Millisecond
		if more != nil {
			more(c, f)
		}
	}})
	follower.WaitReady(t)
	return f, follower
}

// followAtLeast follows until s has applied n windows or 10 s passed (the
// margin: a write must be a millisecond old to be read), and returns how
// many it applied.
func followAtLeast(t *testing.T, s *st.Stack, n int) int {
	t.Helper()
	applied := 0
	for deadline := time.Now().Add(10 * time.Second); applied < n && time.Now().Before(deadline); {
		k, err := s.Evaluator.FollowNow(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		applied += k
	}
	return applied
}

func followerKeepsWarm(t *testing.T, skew time.Duration) {
	f, follower := ownerAndFollower(t, func(c *evaluator.Config, f *fixture) {
		c.Now = func() time.Time { return f.Clock.Now().Add(skew) }
	})
	ctx := context.Background()
	g := &fixture{Stack: follower, web: f.web}
	if err := follower.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := follower.Evaluator.FollowNow(ctx); err != nil || n != 0 {
		t.Fatalf("a first follow with nothing written since the rebuild applied %d windows (%v)", n, err)
	}

	p1 := f.Token(t, prober1)
	for range 10 {
		f.post(t, p1, report(f.web[0], "probe", "failure"), report(f.web[1], "probe", "success"), report(f.web[2], "probe", "success"))
		f.Clock.Advance(time.Second)
		f.Evaluator.EvaluateNow()
	}
	if v := f.verdict(t, "web", f.web[0]); v.State != "ineligible" {
		t.Fatalf("at the owner: %+v", v)
	}
	if err := f.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	// A window the follower writes itself (of evidence forwarded to it,
	// which it keeps) must not come back to it.
	az1 := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	if res, err := follower.Evaluator.IngestForwarded(ctx, az1, []evaluator.Report{{InstanceID: uuid.MustParse(f.web[1]), Class: "probe", Outcome: "success"}}); err != nil || res.Accepted != 1 {
		t.Fatalf("forwarded to the follower: %+v %v", res, err)
	}
	if err := follower.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	if n := metric(t, g, "muster_observed_windows_written_total"); n != 1 {
		t.Fatalf("the follower wrote %v windows, want 1", n)
	}
	if applied := followAtLeast(t, follower, 1); applied != 3 {
		t.Fatalf("the follower applied %d windows, want 3 (web's three instances, probe class)", applied)
	}
	follower.Evaluator.EvaluateNow()
	if v := g.verdict(t, "web", f.web[0]); v.State != "ineligible" {
		t.Errorf("at the follower, the failing instance is %+v", v)
	}
	for _, id := range f.web[1:] {
		if v := g.verdict(t, "web", id); v.State != "eligible" {
			t.Errorf("at the follower, healthy %s is %+v", id, v)
		}
	}
	if n, err := follower.Evaluator.FollowNow(ctx); err != nil || n != 0 {
		t.Errorf("a second follow applied %d windows (%v), want 0: each is applied once", n, err)
	}
	if got := metric(t, &fixture{Stack: follower}, "muster_windows_followed_total"); got != 3 {
		t.Errorf("muster_windows_followed_total = %v, want 3", got)
	}
}

// TestAFollowerAdmitsWhatTheOwnerAdmits: an instance registered after the
// follower started is admitted at the owner on its first probe success;
// the follower, which never hears a sample of it, must hold it admitted
// from the owner's windows alone, or else the replica dealt the service
// when its owner dies would start with it awaiting its first success
// (out of the view and out of the fraction guard's count).
func TestAFollowerAdmitsWhatTheOwnerAdmits(t *testing.T) {
	t.Parallel()
	f, follower := ownerAndFollower(t, nil)
	ctx := context.Background()
	if _, err := follower.Evaluator.FollowNow(ctx); err != nil { // where following starts
		t.Fatal(err)
	}
	in, err := f.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.9", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*st.Stack{f.Stack, follower} {
		if err := s.Evaluator.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
		s.Evaluator.EvaluateNow()
	}
	if x, _ := inRotation(t, follower.Evaluator, "web", in.ID); !x.Awaiting {
		t.Fatalf("a new instance at the follower before any evidence: %+v, want awaiting", x)
	}
	p1 := f.Token(t, prober1)
	for range 3 {
		f.post(t, p1, report(in.ID.String(), "probe", "success"))
		f.Clock.Advance(time.Second)
		f.Evaluator.EvaluateNow()
	}
	if x, ok := inRotation(t, f.Evaluator, "web", in.ID); !ok || x.Awaiting {
		t.Fatalf("at the owner: %+v", x)
	}
	if err := f.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	if followAtLeast(t, follower, 1) == 0 {
		t.Fatal("the follower applied no window of the owner's")
	}
	follower.Evaluator.EvaluateNow()
	if x, ok := inRotation(t, follower.Evaluator, "web", in.ID); !ok || x.Awaiting {
		t.Fatalf("at the follower, the instance the owner admitted is %+v (in rotation %v)", x, ok)
	}
}

// TestADealtReplicaRestoresTheOwnersAdmissions: a replica that missed
// every window of an instance the owner admitted (here it follows
// nothing) holds it awaiting its first success. When it is dealt the
// service, RestoreAdmissions finds the owner's record of admitting it in
// PostgreSQL and takes it as having served, as the rebuild at a start
// does; the services it is not dealt are left as they are.
func TestADealtReplicaRestoresTheOwnersAdmissions(t *testing.T) {
	t.Parallel()
	f, follower := ownerAndFollower(t, nil)
	ctx := context.Background()
	in, err := f.Registry.Register(ctx, admin, netip.Addr{}, "web", registry.Registration{Address: "10.0.0.9", Port: 8080, Zone: "az1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*st.Stack{f.Stack, follower} {
		if err := s.Evaluator.SyncNow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p1 := f.Token(t, prober1)
	f.post(t, p1, report(in.ID.String(), "probe", "success"))
	f.Clock.Advance(time.Second)
	f.Evaluator.EvaluateNow()
	if x, ok := inRotation(t, f.Evaluator, "web", in.ID); !ok || x.Awaiting {
		t.Fatalf("at the owner: %+v", x)
	}
	// The owner's admission is on record (written in the background).
	wait.For(t, 10*time.Second, "the owner's admission on record", func() bool {
		rows, err := db.New(f.Pool).TransitionsLatestFor(ctx, []uuid.UUID{in.ID})
		return err == nil && len(rows) == 1
	})
	follower.Evaluator.EvaluateNow()
	if x, _ := inRotation(t, follower.Evaluator, "web", in.ID); !x.Awaiting {
		t.Fatalf("the follower, which read no window, holds %+v; want awaiting", x)
	}
	if n, err := follower.Evaluator.RestoreAdmissions(ctx, func(s string) bool { return s == "api" }); err != nil || n != 0 {
		t.Fatalf("restoring api's admissions restored %d (%v), want 0", n, err)
	}
	if x, _ := inRotation(t, follower.Evaluator, "web", in.ID); !x.Awaiting {
		t.Fatalf("restoring another service's admissions changed web's instance: %+v", x)
	}
	if n, err := follower.Evaluator.RestoreAdmissions(ctx, func(s string) bool { return s == "web" }); err != nil || n != 1 {
		t.Fatalf("restoring web's admissions restored %d (%v), want 1", n, err)
	}
	follower.Evaluator.EvaluateNow()
	if x, ok := inRotation(t, follower.Evaluator, "web", in.ID); !ok || x.Awaiting {
		t.Fatalf("dealt web, the follower holds the instance the owner admitted as %+v (in rotation %v)", x, ok)
	}
}

// TestAFollowerTakesAServiceWithTheOwnersVerdicts: a follower hears of
// web only through the owner's windows, a flush and a follow late, so it
// holds web's silence off (the gaps are the region's own lag). When the
// owner dies and the follower is dealt web a minute after the owner's
// last window, web's instances are as the owner held them, eligible,
// not silent; and a prober's hard failure, forwarded to the new owner,
// withdraws one alone, as it would have at the owner (a silent instance
// would need a second class).
func TestAFollowerTakesAServiceWithTheOwnersVerdicts(t *testing.T) {
	t.Parallel()
	var dealt atomic.Bool
	f, follower := ownerAndFollower(t, func(c *evaluator.Config, _ *fixture) {
		c.Evaluates = func(service string) bool { return service != "web" || dealt.Load() }
		c.FollowEvery = time.Hour // only FollowNow reads; the hold needs following on
	})
	ctx := context.Background()
	if err := follower.Evaluator.SyncNow(ctx); err != nil {
		t.Fatal(err)
	}
	p1 := f.Token(t, prober1)
	for range 5 {
		f.post(t, p1, report(f.web[0], "probe", "success"), report(f.web[1], "probe", "success"), report(f.web[2], "probe", "success"))
		f.Clock.Advance(time.Second)
		f.Evaluator.EvaluateNow()
	}
	if err := f.Evaluator.FlushNow(ctx); err != nil {
		t.Fatal(err)
	}
	if applied := followAtLeast(t, follower, 3); applied < 3 {
		t.Fatalf("the follower applied %d windows, want 3", applied)
	}
	// The owner is gone: no window for a minute.
	for range 60 {
		f.Clock.Advance(time.Second)
		follower.Evaluator.EvaluateNow()
	}
	for _, id := range f.web {
		if x, ok := inRotation(t, follower.Evaluator, "web", uuid.MustParse(id)); !ok || x.State != eligibility.Eligible {
			t.Fatalf("a minute after the owner's last window, the follower holds %s as %+v; want eligible, as the owner held it", id, x)
		}
	}
	dealt.Store(true)
	az1 := identity.Principal{Kind: identity.KindProber, Subject: "prober-az1"}
	if res, err := follower.Evaluator.IngestForwarded(ctx, az1, []evaluator.Report{{InstanceID: uuid.MustParse(f.web[0]), Class: "probe", Outcome: "hard_failure"}}); err != nil || res.Accepted != 1 {
		t.Fatalf("forwarded to the new owner: %+v %v", res, err)
	}
	follower.Evaluator.EvaluateNow()
	if x, ok := inRotation(t, follower.Evaluator, "web", uuid.MustParse(f.web[0])); ok {
		t.Fatalf("the new owner holds the hard-failed instance as %+v; want it withdrawn", x)
	}
	// Its other instances, unheard since, fall silent a window after the
	// hold stopped, as at any owner.
	for range 16 {
		f.Clock.Advance(time.Second)
		follower.Evaluator.EvaluateNow()
	}
	if x, _ := inRotation(t, follower.Evaluator, "web", uuid.MustParse(f.web[1])); x.State != eligibility.Unknown {
		t.Fatalf("16 s after the new owner took web without a sample, %s is %+v; want unknown", f.web[1], x)
	}
}
