package stream

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// attempts is a min-heap of clients by the time of their next attempt.
type attempts []attempt

type attempt struct {
	at     time.Time
	client int
}

func (h attempts) Len() int           { return len(h) }
func (h attempts) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h attempts) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *attempts) Push(x any)        { *h = append(*h, x.(attempt)) }
func (h *attempts) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// storm is what a simulated reconnect storm did.
type storm struct {
	admittedAt  []time.Duration // since the storm began, in admission order
	firstRetry  []time.Duration // the first Retry-After each refused client got
	refusals    int
	maxInWindow int // most admissions within any window, counted from admittedAt
}

// simulateStorm has n clients hammer a with their first attempts spread
// over the first second, each honouring Retry-After with full-jitter
// backoff as the resolver does (250 ms base, 30 s cap), on an injected
// clock, until all are admitted or the deadline passes.
func simulateStorm(t *testing.T, a *Admission, clock *time.Time, n int, deadline time.Duration) storm {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	start := *clock
	q := make(attempts, n)
	for i := range q {
		q[i] = attempt{at: start.Add(time.Duration(rng.Int64N(int64(time.Second)))), client: i}
	}
	heap.Init(&q)
	tries := make([]int, n)
	var s storm
	connected := 0
	for q.Len() > 0 {
		next := heap.Pop(&q).(attempt)
		if next.at.Sub(start) > deadline {
			t.Fatalf("%d of %d clients still out after %s", q.Len()+1, n, deadline)
		}
		*clock = next.at
		ok, retry := a.Admit(connected)
		if ok {
			connected++
			s.admittedAt = append(s.admittedAt, next.at.Sub(start))
			continue
		}
		s.refusals++
		if tries[next.client] == 0 {
			s.firstRetry = append(s.firstRetry, retry)
		}
		tries[next.client]++
		backoff := time.Duration(rng.Float64() * float64(min(30*time.Second, 250*time.Millisecond<<min(tries[next.client], 20))))
		heap.Push(&q, attempt{at: next.at.Add(max(retry, backoff)), client: next.client})
	}
	for i, at := range s.admittedAt {
		j, _ := slices.BinarySearch(s.admittedAt, at+a.Window())
		s.maxInWindow = max(s.maxInWindow, j-i)
	}
	return s
}

// TestReadmissionSizedByThePopulation: a restarted process has no peak of
// its own, but the census read the subscribers persisted before the
// restart. All of them hammering at once are admitted at most 5% per 10 s
// window, all within about 20 windows plus jitter (10,000 or 60,000
// alike), and the Retry-After values spread the refused over the windows
// the backlog needs.
func TestReadmissionSizedByThePopulation(t *testing.T) {
	for _, n := range []int{10000, 60000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			clock := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
			jitter := rand.New(rand.NewPCG(3, 4))
			a := NewAdmission(AdmissionConfig{Now: func() time.Time { return clock }, Rand: jitter.Float64})
			if st := a.Stats(); st.Budget != 50 || st.PopulationKnown {
				t.Fatalf("a fresh process without a census reading: %+v, want the floor", st)
			}
			budget := n / 20
			a.SetPopulation(Population{Expected: n, Replicas: 1, Live: 1}, clock)
			if st := a.Stats(); st.Budget != budget || !st.PopulationKnown {
				t.Fatalf("with %d persisted: %+v, want a budget of %d", n, st, budget)
			}

			s := simulateStorm(t, a, &clock, n, 30*time.Minute)
			last := s.admittedAt[len(s.admittedAt)-1]
			t.Logf("%d readmitted in %s (%.1f windows), %d refusals, at most %d in any 10 s, first Retry-After p10 %s p50 %s p90 %s",
				n, last, last.Seconds()/10, s.refusals, s.maxInWindow, pct(s.firstRetry, 0.1), pct(s.firstRetry, 0.5), pct(s.firstRetry, 0.9))
			if s.maxInWindow > budget || a.Stats().MaxWindow > budget {
				t.Fatalf("%d admitted within one window (admission says %d), want at most %d (5%%)", s.maxInWindow, a.Stats().MaxWindow, budget)
			}
			// 20 windows is the least at 5% a window; jitter leaves some
			// windows short, the tail comes back a little late.
			if last < 190*time.Second || last > 260*time.Second {
				t.Fatalf("all admitted after %s, want about 200 s (20 windows plus jitter)", last)
			}
			// Refused clients are spread over the ~19 windows still
			// needed, not sent back together.
			if p10, p90 := pct(s.firstRetry, 0.1), pct(s.firstRetry, 0.9); p10 > 40*time.Second || p90 < 160*time.Second {
				t.Fatalf("first Retry-After p10 %s p90 %s: not spread over the backlog's windows", p10, p90)
			}
			if got := a.Stats().Admitted; got != uint64(n) {
				t.Fatalf("admitted %d", got)
			}
		})
	}
}

// TestReadmissionWithoutPopulationIsSlow documents what the census
// prevents: a restarted process that could not read the population admits
// its floor, 50 per window, and needs ~200 windows for the same storm.
func TestReadmissionWithoutPopulationIsSlow(t *testing.T) {
	clock := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Now: func() time.Time { return clock }, Rand: rand.New(rand.NewPCG(5, 6)).Float64})
	s := simulateStorm(t, a, &clock, 2000, 2*time.Hour)
	if s.maxInWindow > 100 { // the peak grows as clients come back: 5% of 2,000 is 100
		t.Fatalf("%d in one window", s.maxInWindow)
	}
	if last := s.admittedAt[len(s.admittedAt)-1]; last < 300*time.Second {
		t.Fatalf("2,000 admitted in %s at the floor", last)
	}
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// TestAdmissionSharesThePopulation: three live replicas share a region of
// 60,000: each admits 5% of its share (1,000 per window), so the region
// admits 5% of its population, not 15%.
func TestAdmissionSharesThePopulation(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Now: func() time.Time { return now }})
	a.SetPopulation(Population{Expected: 60000, Replicas: 4, Live: 3}, now)
	if st := a.Stats(); st.Budget != 1000 {
		t.Fatalf("budget %d, want 1000", st.Budget)
	}
	// This process's own peak wins when it is larger than its share.
	a.Admit(30000)
	if st := a.Stats(); st.Budget != 1500 || st.Peak != 30000 {
		t.Fatalf("with a peak of 30,000: %+v", st)
	}
}

// TestAdmissionPopulationGoesStale: a census reading older than the
// horizon no longer sizes the budget (the census could not refresh it);
// admission falls back to this process's peak.
func TestAdmissionPopulationGoesStale(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Now: func() time.Time { return now }})
	a.SetPopulation(Population{Expected: 10000, Live: 1}, now)
	a.Admit(2000)
	now = now.Add(15*time.Minute + time.Second)
	a.Admit(2000)
	if st := a.Stats(); st.PopulationKnown || st.Budget != 100 {
		t.Fatalf("after the horizon: %+v, want the peak's 5%% (100)", st)
	}
}

// TestAdmissionIsASlidingWindow: no stretch of one window admits more
// than the budget, wherever it starts; a refused caller is told to come
// back no earlier than the next free slot.
func TestAdmissionIsASlidingWindow(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a := NewAdmission(AdmissionConfig{Floor: 10, Now: func() time.Time { return now }, Rand: func() float64 { return 0 }})
	now = now.Add(9 * time.Second)
	for range 10 {
		if ok, _ := a.Admit(0); !ok {
			t.Fatal("refused within the budget")
		}
	}
	now = now.Add(2 * time.Second) // a fixed window would have rolled over here
	ok, retry := a.Admit(10)
	if ok {
		t.Fatal("admitted an 11th within 10 s")
	}
	if retry != 8*time.Second {
		t.Fatalf("Retry-After %s, want 8 s (the first slot frees then)", retry)
	}
	now = now.Add(8 * time.Second)
	if ok, _ := a.Admit(10); !ok {
		t.Fatal("refused once the window had passed")
	}
}

// Check refuses as Admit would but takes no slot.
func TestAdmissionCheckTakesNoSlot(t *testing.T) {
	a := NewAdmission(AdmissionConfig{Floor: 1, Window: time.Hour, Rand: func() float64 { return 0 }})
	for range 3 {
		if ok, _ := a.Check(0); !ok {
			t.Fatal("Check refused with a free slot")
		}
	}
	if ok, _ := a.Admit(0); !ok {
		t.Fatal("Admit refused the one slot after Checks")
	}
	ok, retry := a.Check(0)
	if ok || retry < time.Second {
		t.Fatalf("Check with no slot: ok %v, retry %v", ok, retry)
	}
	if st := a.Stats(); st.Admitted != 1 || st.Refused != 1 || st.InWindow != 1 {
		t.Fatalf("stats %+v; want 1 admitted, 1 refused, 1 in window", st)
	}
}
