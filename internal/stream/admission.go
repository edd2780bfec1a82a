package stream

import (
	"math"
	"math/rand/v2"
	"sync"
	"time"
)

// AdmissionConfig configures reconnect admission (ADR-13).
type AdmissionConfig struct {
	// Window is the admission period: no more than the budget is admitted
	// in any Window-long stretch of time. 10 s by default.
	Window time.Duration
	// Fraction of the expected subscriber population admitted per
	// window: 0.05 by default.
	Fraction float64
	// Floor is the least admitted per window, so a small or empty estate
	// is never starved: 50 by default.
	Floor int
	// PeakHorizon is how far back this process's own "recent peak" looks,
	// and how long a population reading from the census (SetPopulation)
	// stays good without being refreshed: 15 min by default.
	PeakHorizon time.Duration
	// MaxSpread bounds how many windows a Retry-After spreads refused
	// callers over: 30 by default (5 min at 10 s windows).
	MaxSpread int
	Now       func() time.Time
	// Rand returns a float in [0,1) for jitter; math/rand/v2 by default.
	Rand func() float64
}

// Population is the region's expected subscriber population as the census
// last read it from PostgreSQL.
type Population struct {
	// Expected is the sum over replicas seen within the horizon of their
	// recent peak subscriber count.
	Expected int
	// Replicas is how many replicas that sum covers; Live how many of
	// them reported within the last few census intervals. Each live
	// replica admits its share, Expected/Live, so the region as a whole
	// admits Fraction of its population per window.
	Replicas, Live int
}

// Admission caps how many (re)subscriptions are admitted per window. The
// cap is a sliding window: in no Window-long stretch are more than the
// budget admitted, wherever the stretch starts.
type Admission struct {
	cfg AdmissionConfig

	mu        sync.Mutex
	admits    []time.Time // admission times within the last Window, oldest first
	maxWindow int         // the most admissions seen within one Window
	admitted  uint64
	refused   uint64
	peaks     []peakSample // per-window maxima within PeakHorizon
	pop       Population
	popAt     time.Time // when pop was read; zero: never
}

type peakSample struct {
	at time.Time
	n  int
}

// NewAdmission returns an admission controller.
func NewAdmission(cfg AdmissionConfig) *Admission {
	if cfg.Window == 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Fraction == 0 {
		cfg.Fraction = 0.05
	}
	if cfg.Floor == 0 {
		cfg.Floor = 50
	}
	if cfg.PeakHorizon == 0 {
		cfg.PeakHorizon = 15 * time.Minute
	}
	if cfg.MaxSpread == 0 {
		cfg.MaxSpread = 30
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	return &Admission{cfg: cfg}
}

// Window is the admission window.
func (a *Admission) Window() time.Duration { return a.cfg.Window }

// SetPopulation records the region's expected population, read at at.
// It sizes the budget until PeakHorizon after at, so a restarted process
// admits by the population that is coming back rather than by the peak it
// has not seen.
func (a *Admission) SetPopulation(p Population, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pop, a.popAt = p, at
}

// Admit decides one (re)subscription given the current subscriber count.
// When it refuses, retryAfter is a full-jitter delay over the windows the
// backlog needs at the current budget (those not yet back, over what one
// window admits; at least one window, at most MaxSpread), counted from
// when the next slot frees, so refused callers spread out instead of
// coming back together.
func (a *Admission) Admit(current int) (ok bool, retryAfter time.Duration) {
	return a.decide(current, true)
}

// Check is Admit without taking the slot: it refuses (counting the
// refusal, with the same Retry-After) when Admit would, and otherwise
// admits nothing. It lets a caller refuse before doing anything costly
// (verifying a token), and spend a slot with Admit only on a
// subscription it will serve.
func (a *Admission) Check(current int) (ok bool, retryAfter time.Duration) {
	return a.decide(current, false)
}

func (a *Admission) decide(current int, take bool) (ok bool, retryAfter time.Duration) {
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notePeak(now, current)
	a.prune(now)
	pop := a.population(now)
	budget := a.budget(pop)
	if len(a.admits) < budget {
		if !take {
			return true, 0
		}
		a.admits = append(a.admits, now)
		a.admitted++
		a.maxWindow = max(a.maxWindow, len(a.admits))
		return true, 0
	}
	a.refused++
	// The next slot frees when enough of the window's admissions age out
	// of it for the count to drop below the budget.
	free := a.admits[len(a.admits)-budget].Add(a.cfg.Window).Sub(now)
	backlog := max(pop-current, 1)
	windows := min(max((backlog+budget-1)/budget, 1), a.cfg.MaxSpread)
	jitter := time.Duration(a.cfg.Rand() * float64(windows) * float64(a.cfg.Window))
	d := free + jitter
	// Retry-After is whole seconds: round up, so nobody is told to come
	// back before its slot.
	return false, max(time.Second, (d + time.Second - 1).Truncate(time.Second))
}

// prune drops admissions older than one window. Called with mu held.
func (a *Admission) prune(now time.Time) {
	cut := 0
	for cut < len(a.admits) && now.Sub(a.admits[cut]) >= a.cfg.Window {
		cut++
	}
	// Reslicing drops the front; append reallocates once the capacity
	// behind it runs out, so the cost stays amortised O(1).
	a.admits = a.admits[cut:]
}

// population is what the budget is sized by: this replica's share of the
// census's expected population while that reading is fresh, or this
// process's recent peak if larger. Called with mu held.
func (a *Admission) population(now time.Time) int {
	peak := a.peak(now)
	if share, ok := a.share(now); ok {
		return max(peak, share)
	}
	return peak
}

// peak is this process's recent peak. Called with mu held.
func (a *Admission) peak(now time.Time) int {
	peak := 0
	for _, p := range a.peaks {
		if now.Sub(p.at) <= a.cfg.PeakHorizon {
			peak = max(peak, p.n)
		}
	}
	return peak
}

// share is this replica's share of the expected population, if a fresh
// census reading exists. Called with mu held.
func (a *Admission) share(now time.Time) (int, bool) {
	if a.popAt.IsZero() || now.Sub(a.popAt) > a.cfg.PeakHorizon {
		return 0, false
	}
	live := max(a.pop.Live, 1)
	return (a.pop.Expected + live - 1) / live, true
}

// budget is how many subscriptions one window admits for a population.
func (a *Admission) budget(pop int) int {
	return max(a.cfg.Floor, int(math.Floor(a.cfg.Fraction*float64(pop)+1e-9)))
}

func (a *Admission) notePeak(now time.Time, n int) {
	if len(a.peaks) == 0 || now.Sub(a.peaks[len(a.peaks)-1].at) >= a.cfg.Window {
		a.peaks = append(a.peaks, peakSample{at: now, n: n})
	} else if last := &a.peaks[len(a.peaks)-1]; n > last.n {
		last.n = n
	}
	cut := 0
	for cut < len(a.peaks) && now.Sub(a.peaks[cut].at) > a.cfg.PeakHorizon {
		cut++
	}
	a.peaks = a.peaks[cut:]
}

// AdmissionStats describes admission now.
type AdmissionStats struct {
	// Population is the census's last reading and PopulationKnown
	// whether it is fresh enough to size the budget; when it is not, the
	// budget falls back to this process's own recent peak.
	Population      Population
	PopulationKnown bool
	// Peak is this process's recent peak subscriber count.
	Peak int
	// Budget is what one window admits now.
	Budget int
	// InWindow is how many were admitted within the last window;
	// MaxWindow the most within any one window since start.
	InWindow, MaxWindow int
	// Admitted and Refused count decisions since start.
	Admitted, Refused uint64
}

// Stats returns admission's current figures.
func (a *Admission) Stats() AdmissionStats {
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.prune(now)
	_, known := a.share(now)
	return AdmissionStats{
		Population: a.pop, PopulationKnown: known, Peak: a.peak(now), Budget: a.budget(a.population(now)),
		InWindow: len(a.admits), MaxWindow: a.maxWindow, Admitted: a.admitted, Refused: a.refused,
	}
}

// Refused counts refusals since start.
func (a *Admission) Refused() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}
