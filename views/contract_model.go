package views

import "time"

// ContractField is one editable number of a health contract as the
// contract form shows it.
type ContractField struct {
	Name, Label, Help string
	Value             string // as typed, or the stored value
	Step              string // the input's step ("any", "1")
}

// ContractOutcome is what a contract would have done to a service over
// the evidence replayed (package preview's Outcome, as text).
type ContractOutcome struct {
	Removed, Removals, Degraded, Unknown, PeakIneligible int
	FirstRemovalAt, PeakAt                               *time.Time
	GuardTripped                                         bool
	GuardFirstAt                                         *time.Time
	GuardZones                                           []string
	MinHealthyFraction                                   float64
	FinalEligible, FinalIneligible                       int
}

// ContractDifference is one instance the two contracts judge apart.
type ContractDifference struct {
	InstanceID, Zone string
	Current          string // "final / worst, n removals"
	Proposed         string
}

// ContractPreview is a preview's result as the contract page shows it.
type ContractPreview struct {
	From, To                    time.Time
	Instances, Windows          int
	Current, Proposed           ContractOutcome
	Differences                 []ContractDifference
	DifferencesTotal            int
	MoreRemovals, FewerRemovals bool
}

// Contract is the data of a service's contract page: the stored contract
// in an editable form, a preview of the proposed one beside the one in
// force, and the outcome of the last action.
type Contract struct {
	Page
	Service   string
	Version   int64 // the stored contract's (If-Match of a save)
	UpdatedBy string
	UpdatedAt time.Time
	Fields    []ContractField
	// RequireReadiness is the checkbox's state.
	RequireReadiness bool
	CanEdit          bool
	Preview          *ContractPreview
	Done, Refused    string
}
