package assembler

import "time"

// loadMeter adapts the addition window to the region's change rate. It
// counts endpoint changes arriving (Update and RemoveService) in epochs as
// long as the current addition window; at the end of each epoch it
// compares the count with the budget for that epoch (rate × window):
//
//   - above the budget: the window doubles, up to the cap; leaving the
//     base starts a shed episode;
//   - at or below half the budget: the window halves, down to the base;
//     reaching the base ends the episode;
//   - in between: the window holds (the hysteresis keeps a rate near the
//     budget from flapping the window every epoch).
//
// Doubling the window doubles the epoch's budget too, so a sustained rate
// above the budget grows the window to the cap: shedding is a cliff, which
// is easier to reason about during an evacuation than a curve.
type loadMeter struct {
	base, max time.Duration
	budget    float64 // changes per second
	win       time.Duration
	start     time.Time
	count     int
	shedding  bool
	episodes  uint64
}

func (m *loadMeter) add(now time.Time, n int) {
	m.advance(now)
	m.count += n
}

func (m *loadMeter) advance(now time.Time) {
	if m.start.IsZero() {
		m.start = now
		return
	}
	for !now.Before(m.start.Add(m.win)) {
		end := m.start.Add(m.win)
		limit := m.budget * m.win.Seconds()
		switch c := float64(m.count); {
		case c > limit:
			if m.win < m.max {
				m.win = min(2*m.win, m.max)
				if !m.shedding {
					m.shedding = true
					m.episodes++
				}
			}
		case c <= limit/2 && m.win > m.base:
			m.win = max(m.win/2, m.base)
			if m.win == m.base {
				m.shedding = false
			}
		}
		m.start, m.count = end, 0
		if m.win == m.base && !now.Before(m.start.Add(m.win)) {
			// Idle at the base: nothing left to adapt, skip the
			// empty epochs of a long gap.
			m.start = now
			return
		}
	}
}
