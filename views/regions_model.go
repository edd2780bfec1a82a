package views

import "time"

// PeerRegionRow is one peer region followed, as the regions page shows
// it (federation.PeerStatus).
type PeerRegionRow struct {
	Region      string
	URLs        []string
	Connected   bool
	Synced      bool
	LastContact time.Time
	AgeSeconds  float64
	Stale       bool
	Services    int
	Reconnects  uint64
	// Reconciliations counts partition heals; LastReconciliation is the
	// last one's time (zero: none).
	Reconciliations    uint64
	LastReconciliation time.Time
	LastError          string
	// Regressed describes each service whose versions went backwards at
	// the peer (its database restored) and have not passed those held
	// before: "billing (held v50, took v40)".
	Regressed []string
	// Control is the routing control's state for the region ("on", "off"),
	// empty when no routing control is read.
	Control string
}

// RoutingControlRow is one region's routing control.
type RoutingControlRow struct {
	Region, State string
	Since         time.Time
	Named         bool
}

// Regions is the data of the regions page: this region, the
// peer regions it follows and the routing controls it reads.
type Regions struct {
	Page
	Region string
	Peers  []PeerRegionRow
	// StaleAfter is the peer staleness threshold (0: unknown).
	StaleAfter time.Duration
	// Controls are the routing controls in force (nil: none read);
	// ControlSource names the source and ControlStale says whether it
	// could not be read for longer than its threshold.
	Controls      []RoutingControlRow
	ControlSource string
	ControlStale  bool
}
