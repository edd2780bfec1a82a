package reconcile

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/disbelief"
)

// Endpoint is one member of a source's reading: an EndpointSlice endpoint
// of a mapped Service, or a row of an inventory snapshot.
type Endpoint struct {
	// Service is the muster service the endpoint belongs to.
	Service string `json:"service"`
	// Key is what the source identifies it by: a pod UID, a snapshot's
	// instance id. With the source and service it derives the instance id.
	Key     string `json:"key"`
	Address string `json:"address"`
	Port    int    `json:"port"`
	Zone    string `json:"zone"`
	// The EndpointSlice conditions (a snapshot's "ready" sets all three
	// as a ready, non-terminating endpoint would have them).
	Ready       bool `json:"ready"`
	Serving     bool `json:"serving"`
	Terminating bool `json:"terminating"`
	// ID is the instance id the worker derived (registry.ReconciledID).
	ID uuid.UUID `json:"instance_id"`
	// Namespace and KubeService name the Kubernetes Service that claims
	// the endpoint for Service, and Labels are its labels: what a
	// service's member sources authorise (Authorise). Empty for a
	// snapshot.
	Namespace   string            `json:"namespace,omitempty"`
	KubeService string            `json:"kube_service,omitempty"`
	Labels      map[string]string `json:"-"`
	// Vouched: the source's own configuration names where the endpoint
	// comes from for Service (a snapshot source's entries; a cluster's
	// members or issuer mapping listing the namespace for the service).
	// It is what authorises the endpoint of a service that names no
	// member sources.
	Vouched bool `json:"-"`
}

// routable: the endpoint can take traffic by the orchestrator's word.
func (e Endpoint) routable() bool { return e.Ready || e.Serving }

// Reading is a source's full desired set at one moment.
type Reading struct {
	Endpoints []Endpoint
	// Stale, when set, says why the reading is the source's last state
	// rather than a fresh one (an informer that lost its watch keeps its
	// cache: fail-static).
	Stale string
	// At is when the source last confirmed the reading (an informer's
	// last event or sync, a snapshot's read).
	At time.Time
}

// Live is a live instance of the source in the registry.
type Live struct {
	ID      uuid.UUID
	Service string
	Address string
	Port    int
	Zone    string
	// Since is when the registry made the instance. One made after the
	// reading was taken (by another replica, from a newer reading of the
	// same source) is not news to this reading, and its absence from it
	// ends nothing: an id is never reused, so a replica whose informer
	// lags the other's would otherwise end a new pod's instance for good.
	Since time.Time
}

// Disbelief is the threshold a reading is checked against before its
// removals are applied: disbelief.Rule, the rule lease expiry follows too.
type Disbelief struct {
	// Fraction: a reading lacking more than this fraction of the source's
	// live instances, or of one service's, is held (default 0.2).
	Fraction float64
	// MinRemovals: fewer absences than this are always believed
	// (default 3), so a scale-down of a small service is not alarmed. A
	// reading with no endpoints at all while the source has instances is
	// held whatever their number: an empty list is what a broken exporter
	// or a dropped annotation reads as.
	MinRemovals int
	// Window: absences believed within this long count with a later
	// reading's against the threshold, so a source that lies a little at
	// a time is held as one that lies at once (default 2 min). It never
	// releases a hold: only recovery or a confirmation does.
	Window time.Duration
}

// Validate fills defaults and checks the threshold.
func (d *Disbelief) Validate() error {
	if d.Fraction == 0 {
		d.Fraction = 0.2
	}
	if d.MinRemovals == 0 {
		d.MinRemovals = 3
	}
	if d.Window == 0 {
		d.Window = 2 * time.Minute
	}
	switch {
	case d.Fraction <= 0 || d.Fraction >= 1:
		return fmt.Errorf("disbelief fraction %v must be above 0 and below 1", d.Fraction)
	case d.MinRemovals < 1:
		return errors.New("disbelief min_removals must be at least 1")
	case d.Window < 0:
		return errors.New("disbelief window must not be negative")
	}
	return nil
}

func (d Disbelief) rule() disbelief.Rule {
	return disbelief.Rule{Fraction: d.Fraction, MinMass: d.MinRemovals}
}

// Hold is a reading not believed: its absences are not applied. It lasts
// until a reading reports the instances again or an authorised operator
// confirms the absences; no timer ends it.
type Hold struct {
	Since   time.Time `json:"since"`
	Had     int       `json:"had"`
	Lacking int       `json:"lacking"`
	// Services are the services whose absences are held. Had and Lacking
	// count the whole source when it is suspect as a whole (Whole), else
	// these services, each suspect on its own.
	Services []string `json:"services"`
	// Whole: the source as a whole is suspect (its reading is empty, or
	// lacks more than the threshold of it).
	Whole bool `json:"whole,omitempty"`
	// Empty: the reading had no endpoints at all.
	Empty bool `json:"empty,omitempty"`
	// ByService counts each held service on its own (when not Whole).
	ByService map[string]Count `json:"by_service,omitempty"`
}

// Count is what a scope had and lacks.
type Count struct {
	Had     int `json:"had"`
	Lacking int `json:"lacking"`
}

// Confirmation is an operator's word that a source's held absences are
// real: given at At, for the instances listed (disbelief.Confirmation).
type Confirmation = disbelief.Confirmation

// Plan is what one reading means for the registry and the evaluator.
type Plan struct {
	// Create are routable endpoints with no live instance yet.
	Create []Endpoint
	// End are live instances the source no longer reports, or reports
	// terminating and no longer serving.
	End []uuid.UUID
	// Held are absences not applied because the reading is disbelieved.
	Held []uuid.UUID
	// Readiness is the evidence of every instance left alive (and those
	// created), from the endpoint's conditions.
	Readiness []Endpoint
	// Unready are endpoints the source has that are not instances: never
	// ready since they appeared (in Kubernetes, a pod whose readiness
	// probe never passed). The diff lists them as startup failures.
	Unready []Endpoint
	// Hold is set while the reading is disbelieved.
	Hold *Hold
	// Released says a hold ended by recovery or confirmation this pass.
	Released string
	// Confirmed are the held services an operator's confirmation released
	// this pass (their absences are in End), while the hold goes on for
	// the services nobody confirmed.
	Confirmed []string
	// Believed counts, by service, the absences ended because they stayed
	// under the threshold (not by a release, not explicit terminations),
	// net of the instances the same reading created in that service: the
	// worker counts them against the next passes within the window
	// (DecideAfter).
	Believed map[string]int
}

// Decide is the pure core of a pass: reading r of a source against the
// source's live instances, with the hold the previous pass left (nil for
// none), what operators confirmed since that hold began (zero for none;
// VouchedSince joins several confirmations into one), at now. A
// confirmation releases the held absences of a service only while it
// names every one of them: the services it covers are released, the
// others stay held, so one team's word ends its own service's instances
// and nobody else's.
//
// An endpoint becomes an instance when it is first ready or serving (and
// not terminating); it stays one while the source reports it, whatever
// its readiness (readiness is evidence, not existence: one failing probe
// never ends an instance), until the source reports it terminating and no
// longer serving (KEP-1669: terminating but serving stays routable), or
// stops reporting it. Absences are checked against the disbelief
// threshold; explicit terminations are the source's positive word and are
// always believed.
func Decide(d Disbelief, r Reading, live []Live, prev *Hold, confirmed Confirmation, now time.Time) Plan {
	return DecideAfter(d, r, live, prev, confirmed, now, nil)
}

// DecideAfter is Decide for a source that, within the last window, already
// had recent absences believed in passes of their own (Plan.Believed, by
// service): they count with this reading's against the threshold,
// measured on the instances the source (or service) had before them. A
// source that lies a little at a time (a fifth of the fleet each pass) is
// held just as one that lies at once: no single signal may drain a
// service.
//
// The threshold is checked on the whole source, then on each service: a
// source suspect as a whole has all its absences held; otherwise only the
// absences of the services suspect on their own are, and the rest are
// believed.
func DecideAfter(d Disbelief, r Reading, live []Live, prev *Hold, confirmed Confirmation, now time.Time, recent map[string]int) Plan {
	var p Plan
	seen := make(map[uuid.UUID]Endpoint, len(r.Endpoints))
	for _, e := range r.Endpoints {
		// One endpoint in two slices (a slice being replaced): the serving
		// copy wins.
		if old, ok := seen[e.ID]; ok && (old.Serving || !e.Serving) {
			continue
		}
		seen[e.ID] = e
	}
	liveBy := make(map[uuid.UUID]Live, len(live))
	for _, l := range live {
		liveBy[l.ID] = l
	}
	var absent []uuid.UUID
	for _, l := range live {
		e, ok := seen[l.ID]
		switch {
		case !ok && !r.At.IsZero() && l.Since.After(r.At):
			// Made after this reading: not news to it (see Live.Since).
		case !ok:
			absent = append(absent, l.ID)
		case e.Terminating && !e.Serving:
			p.End = append(p.End, l.ID)
		default:
			p.Readiness = append(p.Readiness, e)
		}
	}
	for _, e := range seen {
		if _, ok := liveBy[e.ID]; ok {
			continue
		}
		switch {
		case e.routable() && !e.Terminating:
			p.Create = append(p.Create, e)
			p.Readiness = append(p.Readiness, e)
		case !e.routable() && !e.Terminating:
			p.Unready = append(p.Unready, e)
		}
	}
	// The threshold is checked on the whole source and on each service:
	// a source spanning a thousand instances that loses all fifty of one
	// service lacks 5% of itself, yet would drain that service.
	hadBy, absentBy, createdBy := map[string]int{}, map[string][]uuid.UUID{}, map[string]int{}
	for _, l := range live {
		hadBy[l.Service]++
	}
	for _, id := range absent {
		svc := liveBy[id].Service
		absentBy[svc] = append(absentBy[svc], id)
	}
	for _, e := range p.Create {
		createdBy[e.Service]++
	}
	rule := d.rule()
	suspect := func(had, lacking, absentNow int) bool {
		return absentNow > 0 && rule.Over(had, lacking)
	}
	recentAll := 0
	for _, n := range recent {
		recentAll += n
	}
	var held []uuid.UUID
	var heldServices []string
	var byService map[string]Count
	had, lacking := len(live)+recentAll, len(absent)+recentAll
	// An empty reading of a source that has instances is never believed,
	// whatever their number: no endpoints at all is how a broken exporter
	// or a dropped annotation reads.
	empty := len(r.Endpoints) == 0 && len(absent) > 0
	whole := empty || suspect(had, lacking, len(absent))
	if whole {
		held = absent
		heldServices = slices.Sorted(maps.Keys(absentBy))
	} else {
		had, lacking = 0, 0
		for _, svc := range slices.Sorted(maps.Keys(absentBy)) {
			h, l := hadBy[svc]+recent[svc], len(absentBy[svc])+recent[svc]
			if suspect(h, l, len(absentBy[svc])) {
				held = append(held, absentBy[svc]...)
				heldServices = append(heldServices, svc)
				had, lacking = had+h, lacking+l
				if byService == nil {
					byService = map[string]Count{}
				}
				byService[svc] = Count{Had: h, Lacking: l}
			}
		}
	}
	// A confirmation releases a service's held absences when it vouches
	// for every one of them (a service whose hold grew since waits for a
	// confirmation of its own); the rest of the hold goes on.
	var confirmedBy map[string]int
	if prev != nil && confirmed.Instances != nil && len(held) > 0 {
		heldBy := map[string][]uuid.UUID{}
		for _, id := range held {
			svc := liveBy[id].Service
			heldBy[svc] = append(heldBy[svc], id)
		}
		var keep []uuid.UUID
		var still []string
		for _, svc := range heldServices {
			if !confirmed.Covers(heldBy[svc], prev.Since) {
				keep = append(keep, heldBy[svc]...)
				still = append(still, svc)
				continue
			}
			n := len(heldBy[svc])
			p.Confirmed = append(p.Confirmed, svc)
			p.End = append(p.End, heldBy[svc]...)
			had, lacking = had-n, lacking-n
			delete(byService, svc)
			if confirmedBy == nil {
				confirmedBy = map[string]int{}
			}
			confirmedBy[svc] = n
		}
		held, heldServices = keep, still
	}
	// A hold continues while it holds no service the previous one did not:
	// it keeps the start of the first reading that held them, and a hold
	// that takes in another service starts again, so a confirmation made
	// before a service went missing does not vouch for it.
	continues := prev != nil && !slices.ContainsFunc(heldServices, func(s string) bool { return !slices.Contains(prev.Services, s) })
	// believeUnheld ends the absences of the services neither held nor
	// confirmed, counting them (net of the instances the reading adds to
	// the same service: a pod restarted with a new UID, or a rolled one,
	// is a replacement, not a loss) against the next passes within the
	// window.
	believeUnheld := func() {
		for svc, ids := range absentBy {
			if slices.Contains(heldServices, svc) || slices.Contains(p.Confirmed, svc) {
				continue
			}
			p.End = append(p.End, ids...)
			if n := len(ids) - createdBy[svc]; n > 0 {
				if p.Believed == nil {
					p.Believed = map[string]int{}
				}
				p.Believed[svc] = n
			}
		}
	}
	switch {
	case len(held) == 0 && len(p.Confirmed) > 0:
		believeUnheld()
		p.Released = "confirmed by an operator at " + confirmed.At.UTC().Format(time.RFC3339)
	case len(held) == 0:
		believeUnheld()
		if prev != nil {
			p.Released = "the source reports its instances again"
		}
	default:
		believeUnheld()
		// The absences confirmed while the rest of the hold goes on count
		// with the next readings for one window, as believed ones do: the
		// services nobody confirmed are still judged against the reading
		// that held them, not against what is left once the confirmed
		// instances have ended.
		for svc, n := range confirmedBy {
			if p.Believed == nil {
				p.Believed = map[string]int{}
			}
			p.Believed[svc] += n
		}
		since := now
		if continues {
			since = prev.Since
		}
		p.Held = held
		p.Hold = &Hold{Since: since, Had: had, Lacking: lacking, Services: heldServices, Whole: whole, Empty: empty, ByService: byService}
	}
	sortIDs(p.End)
	sortIDs(p.Held)
	for _, es := range [][]Endpoint{p.Create, p.Readiness, p.Unready} {
		slices.SortFunc(es, func(a, b Endpoint) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	}
	return p
}

// VouchedSince joins the confirmations given at or after since (the start
// of the hold they may release) into one: it vouches for every instance
// any of them names, as of the oldest. Confirmations are given service by
// service, so one team's word for web and another's for api, given
// before the same pass, release both.
func VouchedSince(cs []Confirmation, since time.Time) Confirmation {
	var out Confirmation
	for _, c := range cs {
		if c.At.Before(since) || c.Instances == nil {
			continue
		}
		if out.At.IsZero() || c.At.Before(out.At) {
			out.At = c.At
		}
		out.Instances = append(out.Instances, c.Instances...)
	}
	if !out.At.IsZero() && out.Instances == nil {
		out.Instances = []uuid.UUID{}
	}
	return out
}

// sortIDs orders ids by their bytes (the order of their text form too).
func sortIDs(ids []uuid.UUID) {
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
}
