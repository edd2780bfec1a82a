package stream

import (
	"math/rand/v2"
	"sync"
	"time"
)

// AdmissionConfig configures reconnect admission (ADR-13).
type AdmissionConfig struct {
	// Window is the admission period: 10 s by default.
	Window time.Duration
	// Fraction of the recent peak subscriber population admitted per
	// window: 0.05 by default.
	Fraction float64
	// Floor is the least admitted per window, so a small or empty estate
	// is never starved: 50 by default.
	Floor int
	// PeakHorizon is how far back "recent peak" looks: 15 min by default.
	PeakHorizon time.Duration
	Now         func() time.Time
	// Rand returns a float in [0,1) for jitter; math/rand/v2 by default.
	Rand func() float64
}

// Admission caps how many (re)subscriptions are admitted per window.
type Admission struct {
	cfg AdmissionConfig

	mu          sync.Mutex
	windowStart time.Time
	admitted    int
	refused     uint64
	peaks       []peakSample // per-window maxima within PeakHorizon
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	return &Admission{cfg: cfg}
}

// Admit decides one (re)subscription given the current subscriber count.
// When it refuses, retryAfter spreads the refused callers over the next
// windows (full jitter), so they do not come back together.
func (a *Admission) Admit(current int) (ok bool, retryAfter time.Duration) {
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.Sub(a.windowStart) >= a.cfg.Window {
		a.windowStart, a.admitted = now, 0
	}
	a.notePeak(now, current)
	if a.admitted < a.budget() {
		a.admitted++
		return true, 0
	}
	a.refused++
	rest := a.cfg.Window - now.Sub(a.windowStart)
	jitter := time.Duration(a.cfg.Rand() * float64(4*a.cfg.Window))
	return false, (rest + jitter).Round(time.Second) + time.Second
}

// budget is how many subscriptions one window admits now. Called with mu held.
func (a *Admission) budget() int {
	peak := 0
	for _, p := range a.peaks {
		peak = max(peak, p.n)
	}
	return max(a.cfg.Floor, int(a.cfg.Fraction*float64(peak)))
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

// Refused counts refusals since start.
func (a *Admission) Refused() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.refused
}
