package views

import "strconv"

// LagBucket is one bar of a lag histogram.
type LagBucket struct {
	Label string // "≤ 5ms", "> 5s"
	Short string // under its bar: "5ms", ">5s"
	Count uint64
}

// LagHistogram is one step's lags for a service.
type LagHistogram struct {
	Stage, Title, Help string
	Buckets            []LagBucket
	Total              uint64
	Mean               string
}

// Lag is the data of a service's lag page.
type Lag struct {
	Page
	Service    string
	Histograms []LagHistogram
}

// histWidth, histHeight and histBar are a histogram's size and one
// bar's slot in pixels.
const histHeight, histBar = 120.0, 48.0

func (h LagHistogram) width() float64 { return float64(len(h.Buckets)) * histBar }

func (h LagHistogram) top() uint64 {
	var m uint64 = 1
	for _, b := range h.Buckets {
		m = max(m, b.Count)
	}
	return m
}

// barHeight is bucket i's bar height (at least 1 px for a non-empty one).
func (h LagHistogram) barHeight(i int) float64 {
	c := h.Buckets[i].Count
	if c == 0 {
		return 0
	}
	return max(1, float64(c)/float64(h.top())*(histHeight-16))
}

func f1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
