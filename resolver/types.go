package resolver

import (
	"errors"
	"time"
)

// Wire values of Zone.Guard, Endpoint.Health and Endpoint.State that the
// resolver interprets.
const (
	GuardOK      = "ok"
	GuardTripped = "tripped"

	HealthKnown   = "known"
	HealthUnknown = "unknown"

	StateIneligible = "ineligible"
)

// DefaultMaxShrink is the largest fraction of a service's routable set one
// update may remove, beyond what the registry removed, before the shrink
// guard holds the larger set.
const DefaultMaxShrink = 0.5

// DefaultConfirmAfter is how long the server must stand by a smaller set
// the shrink guard is holding back before routing follows it.
const DefaultConfirmAfter = 60 * time.Second

// Sentinel errors. Callers test them with errors.Is; the resolver wraps
// them with the service and versions involved.
var (
	// ErrUnknownService: the service was not configured in New.
	ErrUnknownService = errors.New("resolver: unknown service")
	// ErrNoView: nothing is cached for the service yet (cold start).
	ErrNoView = errors.New("resolver: no view cached")
	// ErrNoEndpoints: the cached view has no routable endpoint.
	ErrNoEndpoints = errors.New("resolver: no routable endpoints")
	// ErrStale: the update's version is at or below the held one; it was
	// ignored.
	ErrStale = errors.New("resolver: stale update ignored")
	// ErrGap: the delta does not start at the held version; fetch a full
	// view.
	ErrGap = errors.New("resolver: delta does not follow the held version")
	// ErrChecksum: the endpoint set after the update does not match the
	// update's checksum; nothing changed; fetch a full view.
	ErrChecksum = errors.New("resolver: checksum mismatch")
	// ErrInvalid: the update is malformed (duplicate instance ids, wrong
	// service); nothing changed.
	ErrInvalid = errors.New("resolver: invalid update")
	// ErrWouldEmpty: the update was recorded but would leave no routable
	// endpoint, and the registry does not say the instances left, so
	// routing keeps the larger set it held until the server has stood by
	// the update for the confirm time (see Hold).
	ErrWouldEmpty = errors.New("resolver: update would leave no routable endpoints; holding previous set")
	// ErrShrinkCapped: the update was recorded but shrinks the routable set
	// beyond the cap by more than the registry removed, so routing keeps
	// the larger set it held until the server has stood by the update for
	// the confirm time (see Hold).
	ErrShrinkCapped = errors.New("resolver: update shrinks routable set beyond cap; holding previous set")
	// ErrHoldFollowed is not a failure: it marks the Event reporting that
	// routing followed a held-back update because the server stood by a
	// smaller set for the confirm time.
	ErrHoldFollowed = errors.New("resolver: server stood by a smaller set; routing follows it")
	// ErrCorruptCache: a last-known-good file could not be trusted and was
	// ignored.
	ErrCorruptCache = errors.New("resolver: corrupt cache file")
	// ErrPersist: writing a last-known-good file failed; the in-memory
	// state is unaffected.
	ErrPersist = errors.New("resolver: persist view")
)

// Endpoint is one instance of a service as muster publishes it.
type Endpoint struct {
	// InstanceID is the canonical lowercase 36-character UUID text, which
	// sorts in the same order as the UUID's bytes.
	InstanceID   string   `json:"instance_id"`
	Address      string   `json:"address"`
	Port         int      `json:"port"`
	Zone         string   `json:"zone"`
	State        string   `json:"state"`
	Weight       float64  `json:"weight"`
	Health       string   `json:"health"`
	Capabilities []string `json:"capabilities"`
	// Quarantined: held out of rotation by flap quarantine; published only
	// while its zone's guard is tripped. It is part of the checksum.
	Quarantined bool `json:"quarantined,omitempty"`
	// Override is an operator's override in force (ADR-15), already
	// applied to State and Weight by muster; it says who and why. It is
	// not part of the checksum.
	Override *Override `json:"override,omitempty"`
	// LeaseExpired: the registry ended the instance because its lease ran
	// out, and muster still publishes it only because its zone's guard is
	// tripped (state "ineligible"). It is not part of the checksum.
	LeaseExpired bool `json:"lease_expired,omitempty"`
	// Region is the region the endpoint runs in, set on the endpoints of
	// a peer region's view served through this region; empty
	// on a local view's. It is not part of the checksum.
	Region string `json:"region,omitempty"`
}

// Override is an operator's decision about one endpoint, as the view
// carries it.
type Override struct {
	ID     string `json:"id"`
	Action string `json:"action"` // mark_ineligible or mark_eligible
	Reason string `json:"reason"` // who, until when and why
}

// Zone is muster's guard decision for one zone of a service.
type Zone struct {
	Guard string `json:"guard"`
	// Eligible counts the zone's routable instances; Total the capacity
	// that was there (instances admitted at least once, plus lease-expired
	// ones the guard keeps), so a new zone can have Total 0 while
	// instances are registered in it.
	Eligible           int     `json:"eligible"`
	Total              int     `json:"total"`
	MinHealthyFraction float64 `json:"min_healthy_fraction"`
	// Registered is how many instances the registry lists in the zone
	// (active registrations, routable or not, admitted or not; instances
	// whose lease expired are not counted). Nil: the server did not say
	// (a muster from before zones carried it). A zone absent from a view has no
	// registered instance. The shrink guard uses it to tell a scale-down
	// or decommission from a fault; it is not part of the checksum.
	Registered *int `json:"registered,omitempty"`
	// TrafficWeight is the zone's traffic preference in [0,1] set by
	// shift-backs (ADR-13): 0 while drained, the current step while
	// traffic returns. Pick multiplies it into endpoint weights. Nil
	// (a view from a muster without shift-backs) means 1.
	TrafficWeight *float64 `json:"traffic_weight,omitempty"`
}

// Traffic returns the zone's traffic weight, 1 when not given, clamped
// to [0,1].
func (z Zone) Traffic() float64 {
	if z.TrafficWeight == nil {
		return 1
	}
	return min(max(*z.TrafficWeight, 0), 1)
}

// View is a full routing view of one service.
type View struct {
	Service     string          `json:"service"`
	Version     uint64          `json:"version"`
	Endpoints   []Endpoint      `json:"endpoints"`
	Zones       map[string]Zone `json:"zones"`
	GeneratedAt time.Time       `json:"generated_at"`
	Checksum    string          `json:"checksum"`
	// Region and AgeSeconds are set on a peer region's view served
	// through this region (its service is then "<service>@<region>",
	// see RemoteSeries): the region it comes from, and how old the
	// copy may have been when it was sent (the time since that region
	// last answered). Remote endpoints are as fresh as that age.
	Region     string  `json:"region,omitempty"`
	AgeSeconds float64 `json:"age_seconds,omitempty"`
	// Signature is muster's signature of the view by the region's key;
	// checked only with WithViewKeys (Config.ViewKeys).
	Signature *Signature `json:"signature,omitempty"`
}

// Delta takes a view at FromVersion to the view at Version.
type Delta struct {
	Service      string          `json:"service"`
	FromVersion  uint64          `json:"from_version"`
	Version      uint64          `json:"version"`
	Upserts      []Endpoint      `json:"upserts,omitempty"`
	Removals     []string        `json:"removals,omitempty"`
	Zones        map[string]Zone `json:"zones,omitempty"`
	RemovedZones []string        `json:"removed_zones,omitempty"`
	Checksum     string          `json:"checksum"`
	Withdrawal   bool            `json:"withdrawal"`
	GeneratedAt  time.Time       `json:"generated_at"`
	// Signature is the signature of the view the delta produces.
	Signature *Signature `json:"signature,omitempty"`
}
