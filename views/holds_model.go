package views

import "time"

// HoldRow is one held removal as the holds page shows it.
type HoldRow struct {
	Gate, Scope        string
	Since              time.Time
	Had, Lacking, Held int
	Threshold          float64
	Partition, Detail  string
	Services           []string
}

// Holds is the data of the removal holds page: every gate's held
// removals (lease expiry, each reconciliation source), with a
// confirmation form per hold for operators.
type Holds struct {
	Page
	Holds []HoldRow
	// LeaseGrace: lease expiry is waiting out its grace (after a start,
	// readiness or a database outage).
	LeaseGrace bool
	CanAct     bool
	// Done is what the last action did; Refused why it was refused.
	Done, Refused string
}
