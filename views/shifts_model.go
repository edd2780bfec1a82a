package views

import (
	"fmt"
	"time"
)

// ShiftRow is one shift as the shift-backs page shows it.
type ShiftRow struct {
	ID, Scope, Target, Reason string
	Manual                    bool
	State                     string // draining, returning, pending_confirmation, completed, cancelled
	Step                      int
	Weight                    float64 // traffic weight published now
	// NextWeight and NextStepAt are the next move and the earliest time
	// it is allowed; HasNext is false once the shift has ended.
	HasNext    bool
	NextWeight float64
	NextStepAt time.Time
	// PendingSince is when the shift began waiting for its final
	// confirmation (zero when it is not waiting).
	PendingSince time.Time
	// Alarm: the shiftback_pending alarm is open for this shift's target.
	Alarm                 bool
	StartedBy, LastStepBy string
	StartedAt, LastStepAt time.Time
	ConfirmedBy           string
	ConfirmedAt, EndedAt  time.Time
}

// BudgetRow is one service's figures in a refused drain.
type BudgetRow struct {
	Service                            string
	InRotationOutside, Total, Required int
	MinHealthyFraction                 float64
}

// ShiftRefusal explains a refused shift operation in plain words, with the
// figures that decided it.
type ShiftRefusal struct {
	Heading string
	Text    string
	// NextStepAt is when the refused step is allowed (dwell refusals).
	NextStepAt time.Time
	// Budget lists the services a drain would take below their minimum.
	Budget []BudgetRow
	// Fields are the form fields that were wrong, in words.
	Fields []string
}

// DrainForm is the drain form's values, kept when a drain is refused.
type DrainForm struct {
	Zone, Reason string
	Manual       bool
}

// Shifts is the data of the shift-backs page.
type Shifts struct {
	Page
	// Pending are manual shifts waiting for their final confirmation;
	// Active the others still under way (draining or returning).
	Pending, Active []ShiftRow
	// Completed is one page of ended shifts, oldest first, starting after
	// the cursor After; Next is the cursor of the following page.
	Completed   []ShiftRow
	After, Next string
	// CanAct: the signed-in role may drain, step and confirm (operator
	// or admin). Viewers see no buttons; the server refuses them anyway.
	CanAct bool
	// Zones offered by the drain form (from the published views).
	Zones []string
	Form  DrainForm
	// Done says what the last action did; Refusal why it was refused.
	Done    string
	Refusal *ShiftRefusal
	// MinReason is the shortest reason a drain accepts.
	MinReason int
	Error     string
}

// Since renders how long ago t was as a duration: "42 s", "3 min 12 s",
// "2 h 5 min".
func Since(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%d s", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
	}
	return fmt.Sprintf("%d h %d min", int(d.Hours()), int(d.Minutes())%60)
}
