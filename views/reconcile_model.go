package views

import "time"

// Reconcile is the data of the reconciliation page: each
// source's state, and the diff between the sources and the registry.
type Reconcile struct {
	Page
	Sources []ReconcileSource
	// Counts are the items per kind, in the order Kinds lists them.
	Kinds  []string
	Counts map[string]int
	Items  []ReconcileItem
	// Configured is false when this muster reconciles no sources.
	Configured bool
	Error      string
}

// ReconcileSource is one source's state after its last pass.
type ReconcileSource struct {
	Name        string
	LastPass    time.Time
	LastReading time.Time
	Endpoints   int
	Live        int
	Error       string
	Stale       string
	// Held, when positive, is how many removals a disbelief threshold
	// holds, of Had, since HeldSince (until the source recovers or an
	// operator confirms on the holds page).
	Held, Had int
	HeldSince time.Time
}

// ReconcileItem is one divergence.
type ReconcileItem struct {
	Kind, Source, Service, Instance, Key, Address, Zone, Detail string
	Port                                                        int
}
