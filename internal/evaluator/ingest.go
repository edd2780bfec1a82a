package evaluator

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/internal/eligibility"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/registry"
)

// Report is one item of a POST /v1/reports batch: a single outcome, or (for
// passive evidence) an aggregate of successes and failures.
type Report struct {
	InstanceID uuid.UUID  `json:"instance_id"`
	Class      string     `json:"class"`
	Outcome    string     `json:"outcome,omitempty"`
	Dependency string     `json:"dependency,omitempty"`
	At         *time.Time `json:"at,omitempty"`
	Successes  *uint32    `json:"successes,omitempty"`
	Failures   *uint32    `json:"failures,omitempty"`
}

// Refusal explains why one item of a batch was not accepted.
type Refusal struct {
	Index  int    `json:"index"`
	Reason string `json:"reason"`
	Code   string `json:"code"`
}

// Result is the answer to a batch.
type Result struct {
	Accepted int       `json:"accepted"`
	Refused  []Refusal `json:"refused"`
	// Services names, by index of the batch, the service of each item
	// accepted ("" for one refused), for the forwarder's routing; never
	// sent to the reporter. Set by Ingest only.
	Services []string `json:"-"`
}

// MaxBatch bounds the items in one batch.
const MaxBatch = 5000

// Refusal codes, also the label of muster_samples_refused_total.
const (
	codeUnknownInstance = "unknown_instance"
	// codeUnverifiedInstance: an id this process does not know and could
	// not look up just now (see loadUnknown); unlike unknown_instance it
	// may well be accepted if reported again.
	codeUnverifiedInstance = "unverified_instance"
	codeBadItem            = "invalid"
	codeNotOwnInstance     = "not_own_instance"
	codeNotAssigned        = "not_assigned"
	// codeNotGranted: passive evidence from a caller that may not resolve
	// the instance's service.
	codeNotGranted = "not_granted"
	codeWrongKind  = "wrong_identity_kind"
	codeStale      = "stale"
	codeFuture     = "future"
)

// Retryable reports whether a refusal with code may not be met again
// by the same item a few seconds later on another replica: the
// instance could not be looked up just now (unverified_instance), or
// the prober's assignment or the caller's grant has not reached this
// replica's copy yet (not_assigned, not_granted), while the replica that
// accepted the item already holds it. The evidence forwarder retries
// those and counts the rest as refused.
func Retryable(code string) bool {
	switch code {
	case codeUnverifiedInstance, codeNotAssigned, codeNotGranted:
		return true
	}
	return false
}

// Ingest attributes and applies one batch from actor. It never fails as a
// whole for a bad item; it fails only when the evaluator is not ready.
// Instances the batch names that the evaluator has not loaded are looked
// up in PostgreSQL on ctx first (see loadUnknown), so a report may follow
// its instance's registration, on any replica, at once.
func (e *Evaluator) Ingest(ctx context.Context, actor identity.Principal, reports []Report) (Result, error) {
	return e.ingest(ctx, actor, reports, false)
}

// IngestForwarded applies a batch another replica of the region accepted
// from actor and forwarded (internal/forward). That replica
// proved what only the request it received could prove: the address a
// self-report came from and the instance credential it presented. Those
// proofs are not asked again (the forwarded batch carries neither); every
// other check is, against this replica's own copy of the registry: the
// item's validation, that the instance exists, the actor's kind, service,
// pod binding, prober assignment and grants.
//
// What it applies is counted in the observed windows like evidence taken
// here: only a service's owner writes its windows (Config.Fence), so the
// owner writes the region's evidence once, wherever it landed. It is not
// counted in muster_samples_accepted_total and
// muster_samples_refused_total (the receiving replica counts it there),
// but in muster_samples_forwarded_total by result. Its refusals are
// answered, not audited (the receiving replica audited its own).
func (e *Evaluator) IngestForwarded(ctx context.Context, actor identity.Principal, reports []Report) (Result, error) {
	return e.ingest(ctx, actor, reports, true)
}

func (e *Evaluator) ingest(ctx context.Context, actor identity.Principal, reports []Report, forwarded bool) (Result, error) {
	if !e.ready.Load() {
		return Result{}, ErrNotReady
	}
	res := Result{Refused: []Refusal{}}
	refuse := func(i int, code, format string, args ...any) {
		res.Refused = append(res.Refused, Refusal{Index: i, Code: code, Reason: fmt.Sprintf(format, args...)})
		if !forwarded {
			e.metrics.refused.WithLabelValues(code).Inc()
		}
	}
	reporter := e.internReporter(actor.String())
	hard := false
	at := attribution{actor: actor, reporter: reporter, source: SourceAddr(ctx), credential: InstanceCredential(ctx), proven: forwarded}

	// One pass over the batch under e.mu: an item about an instance not
	// loaded here is put aside, and decided after those are looked up in
	// PostgreSQL without the lock. (A first pass only to find them would
	// look every instance up twice: the map holds a region's instances,
	// and each lookup is a cache miss, the hottest cost of ingest.)
	var later []int
	one := func(i int, r Report, inst instanceInfo, known bool, answers map[uuid.UUID]unknownAnswer, now time.Time) {
		s, code, why := e.attribute(&at, r, inst, known, now)
		if code == codeUnknownInstance {
			if a, ok := answers[r.InstanceID]; ok {
				code, why = a.code, a.reason
			} else if state, ok := e.misses.get(r.InstanceID, now); ok {
				// Retired between the lookup and now.
				a := missAnswer(r.InstanceID, state)
				code, why = a.code, a.reason
			}
		}
		if code != "" {
			refuse(i, code, "%s", why)
			return
		}
		if !forwarded {
			if res.Services == nil {
				res.Services = make([]string, len(reports))
			}
			service := inst.service
			res.Services[i] = service
			if e.cfg.Evaluates != nil && !e.cfg.Evaluates(service) {
				// Kept by its owner, to which the
				// forwarder takes it; nothing of it is held here.
				res.Accepted++
				return
			}
		}
		if err := e.engine.Observe(s); err != nil {
			refuse(i, codeUnknownInstance, "instance %s is not known to the evaluator", r.InstanceID)
			return
		}
		e.countWindow(inst.win, s)
		res.Accepted++
		hard = hard || s.Outcome == eligibility.HardFailure
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.cfg.Now()
	for i, r := range reports {
		inst, known := e.instances[r.InstanceID]
		if !known {
			later = append(later, i)
			continue
		}
		one(i, r, inst, true, nil, now)
	}
	if len(later) > 0 {
		var unknown []uuid.UUID
		seen := map[uuid.UUID]bool{}
		for _, i := range later {
			if id := reports[i].InstanceID; !seen[id] {
				seen[id] = true
				unknown = append(unknown, id)
			}
		}
		e.mu.Unlock()
		answers := e.loadUnknown(ctx, unknown)
		e.mu.Lock()
		now = e.cfg.Now()
		for _, i := range later {
			inst, known := e.instances[reports[i].InstanceID]
			one(i, reports[i], inst, known, answers, now)
		}
		// Refusals are listed in the batch's order.
		slices.SortStableFunc(res.Refused, func(a, b Refusal) int { return cmp.Compare(a.Index, b.Index) })
	}
	if forwarded {
		e.metrics.forwarded.WithLabelValues("accepted").Add(float64(res.Accepted))
		e.metrics.forwarded.WithLabelValues("refused").Add(float64(len(res.Refused)))
	} else {
		e.metrics.accepted.Add(float64(res.Accepted))
	}
	if hard {
		select {
		case e.urgent <- struct{}{}:
		default:
		}
	}
	// Ids that could not be looked up ask for an early registry refresh,
	// which loads every instance registered since the last one. Ids known
	// to be missing or ended do not: a refresh would not change their
	// answer, and reports naming made-up ids should not turn into
	// refreshes.
	for _, r := range res.Refused {
		if r.Code == codeUnverifiedInstance {
			select {
			case e.kick <- struct{}{}:
			default:
			}
			break
		}
	}
	return res, nil
}

// attribute checks one report against the reporter's identity and turns it
// into a sample; inst is the report's instance (known false: none). It
// returns a refusal code and reason, or "" on success. Called with e.mu
// held.
func (e *Evaluator) attribute(at *attribution, r Report, inst instanceInfo, known bool, now time.Time) (eligibility.Sample, string, string) {
	actor, reporter := at.actor, at.reporter
	var s eligibility.Sample
	if !known {
		return s, codeUnknownInstance, fmt.Sprintf("no active instance %s", r.InstanceID)
	}
	class, err := eligibility.ParseClass(r.Class)
	if err != nil {
		return s, codeBadItem, fmt.Sprintf("class must be probe, self or passive, got %q", r.Class)
	}
	s = eligibility.Sample{Instance: eligibility.InstanceID(r.InstanceID), Class: class, At: now, Reporter: reporter}
	if r.At != nil {
		switch {
		case r.At.After(now.Add(maxClockSkew)):
			return s, codeFuture, fmt.Sprintf("at %s is in the future", r.At.Format(time.RFC3339))
		case r.At.Before(now.Add(-maxSampleAge)):
			return s, codeStale, fmt.Sprintf("at %s is older than %s", r.At.Format(time.RFC3339), maxSampleAge)
		case r.At.Before(now):
			s.At = *r.At
		}
	}
	aggregate := r.Successes != nil || r.Failures != nil
	switch {
	case aggregate && class != eligibility.Passive:
		return s, codeBadItem, "successes and failures are aggregates of passive evidence only"
	case aggregate && r.Outcome != "":
		return s, codeBadItem, "give either an outcome or successes/failures, not both"
	case aggregate:
		if r.Successes != nil {
			s.Successes = *r.Successes
		}
		if r.Failures != nil {
			s.Failures = *r.Failures
		}
		if s.Successes == 0 && s.Failures == 0 {
			return s, codeBadItem, "an aggregate needs successes or failures above zero"
		}
	default:
		o, err := eligibility.ParseOutcome(r.Outcome)
		if err != nil {
			return s, codeBadItem, fmt.Sprintf("outcome must be success, failure, hard_failure or unobservable, got %q", r.Outcome)
		}
		s.Outcome = o
	}
	if r.Dependency != "" {
		if class != eligibility.Self {
			return s, codeBadItem, "only self-reports may name a dependency"
		}
		if len(r.Dependency) > 63 {
			return s, codeBadItem, "dependency name longer than 63 characters"
		}
		s.Dependency = r.Dependency
	}

	switch class {
	case eligibility.Self:
		if actor.Kind != identity.KindWorkload {
			return s, codeWrongKind, fmt.Sprintf("self-reports come from the instance's own workload identity, not a %s", actor.Kind)
		}
		if actor.Service != inst.service {
			return s, codeNotOwnInstance, fmt.Sprintf("%s may report only about instances of %s, not of %s", actor, actor.Service, inst.service)
		}
		// A token bound to one pod (a Kubernetes service-account token)
		// speaks for that pod's reconciled instance only,
		// wherever the report comes from.
		if actor.Pod != "" {
			own := registry.ReconciledID(registry.SourcePrefixKubernetes+actor.Cluster, inst.service, actor.Pod)
			if r.InstanceID != own {
				return s, codeNotOwnInstance, fmt.Sprintf("the token is bound to pod %s of cluster %s, whose instance is %s; a self-report speaks for its own instance only, not %s",
					actor.Pod, actor.Cluster, own, r.InstanceID)
			}
			break
		}
		// Proven by the replica that received the report (IngestForwarded).
		if at.proven {
			break
		}
		// An instance speaks for itself only: the report must come from
		// the address it registered, or the token must vouch for it, the
		// proof registration asks (ADR-15). A sibling cannot report its
		// neighbours unready.
		addr, _ := netip.ParseAddr(inst.address)
		if !registry.HoldsAddress(actor, addr, at.source) {
			src := "an unknown address"
			if at.source.IsValid() {
				src = at.source.Unmap().String()
			}
			return s, codeNotOwnInstance, fmt.Sprintf("a self-report speaks for the instance that sends it: instance %s is at %s, the report came from %s and the token vouches for no such address",
				r.InstanceID, inst.address, src)
		}
		// On one host every instance of a service shares the address: an
		// instance registered with a credential is itself only with it,
		// so a sibling's report is not its self-evidence, and
		// is refused (and audited) as any report about another instance.
		switch inst.credential.Check(at.credential) {
		case registry.CredentialMissing:
			return s, codeNotOwnInstance, fmt.Sprintf("instance %s was registered with an instance credential and the report presents none: a self-report speaks for its own instance only, which it proves with the credential its registration returned (the %s header)",
				r.InstanceID, registry.CredentialHeader)
		case registry.CredentialWrong:
			return s, codeNotOwnInstance, fmt.Sprintf("the instance credential the report presents is not instance %s's: a self-report speaks for its own instance only, not for another instance on the same host",
				r.InstanceID)
		}
	case eligibility.Probe:
		if actor.Kind != identity.KindProber {
			return s, codeWrongKind, fmt.Sprintf("probe evidence comes from prober identities, not a %s", actor.Kind)
		}
		// Assignments are held under the prober's name, which carries its
		// issuer unless that is the home one.
		a := e.probers[actor.ProberName()]
		if a == nil || !a.covers(r.InstanceID, inst.svc, inst.service) {
			return s, codeNotAssigned, fmt.Sprintf("prober %s is not assigned instance %s of %s", actor.ProberName(), r.InstanceID, inst.service)
		}
		s.Reporter = a.id
	case eligibility.Passive:
		// Callers' outcomes, from callers: workloads that may resolve the
		// service (its own, or granted). Weighted by distinct reporter,
		// not volume, in the core.
		if actor.Kind != identity.KindWorkload {
			return s, codeWrongKind, fmt.Sprintf("passive evidence comes from the workloads that call %s, not a %s", inst.service, actor.Kind)
		}
		if !at.mayCall(e.cfg.MayResolve, inst.service) {
			return s, codeNotGranted, fmt.Sprintf("%s may not resolve %s, so it cannot have called it: passive evidence comes from its callers (its grants) and itself", actor, inst.service)
		}
	}
	return s, "", ""
}

// attribution is who sent a batch: the identity, its reporter id and the
// address the request came from, with the batch's answers about which
// services it may call.
type attribution struct {
	actor      identity.Principal
	reporter   eligibility.ReporterID
	source     netip.Addr
	credential registry.Credential
	// proven: the source address and the instance credential were
	// checked by the replica that received the batch (IngestForwarded).
	proven bool
	calls  map[string]bool
}

// mayCall reports whether the actor may resolve service (asked once per
// service per batch). Without an authoriser only the service's own
// workloads may.
func (a *attribution) mayCall(may func(identity.Principal, string) error, service string) bool {
	if ok, asked := a.calls[service]; asked {
		return ok
	}
	ok := a.actor.Service == service
	if !ok && may != nil {
		ok = may(a.actor, service) == nil
	}
	if a.calls == nil {
		a.calls = map[string]bool{}
	}
	a.calls[service] = ok
	return ok
}

type sourceKey struct{}

// WithSourceAddr returns ctx carrying the network address a batch of
// reports came from (the TCP peer; forwarded headers prove nothing), which
// Ingest checks a self-report against.
func WithSourceAddr(ctx context.Context, addr netip.Addr) context.Context {
	return context.WithValue(ctx, sourceKey{}, addr)
}

// SourceAddr is the address WithSourceAddr put in ctx, or the zero Addr.
func SourceAddr(ctx context.Context) netip.Addr {
	a, _ := ctx.Value(sourceKey{}).(netip.Addr)
	return a
}

type credentialKey struct{}

// WithInstanceCredential returns ctx carrying the instance credential a
// batch of reports presented (registry.CredentialHeader), which Ingest
// checks a self-report about an instance with a credential against.
func WithInstanceCredential(ctx context.Context, c registry.Credential) context.Context {
	return context.WithValue(ctx, credentialKey{}, c)
}

// InstanceCredential is the credential WithInstanceCredential put in
// ctx, or none.
func InstanceCredential(ctx context.Context) registry.Credential {
	c, _ := ctx.Value(credentialKey{}).(registry.Credential)
	return c
}

const (
	maxClockSkew = 5 * time.Second
	maxSampleAge = 5 * time.Minute
)

// proberAssignment is an in-memory copy of a prober's assignments.
type proberAssignment struct {
	id        eligibility.ReporterID
	services  map[string]bool
	instances map[uuid.UUID]bool
	// named[n] says whether the service numbered n (serviceNumber) is one
	// of services: the check on every probe report, without hashing the
	// name. A service numbered after this assignment was built is not
	// one of them (building it numbered all it names).
	named []bool
	// key and members say what the engine's target set was built from.
	key     string
	members uint64
	// src is the assignment as the registry gave it; gen is the
	// evaluator's assignGen when ProberAssigned applied it (0 when a
	// refresh did), so a refresh that read the assignments before it
	// does not put the older ones back.
	src registry.ProberAssignments
	gen uint64
}

// covers says whether the assignment covers instance id of service
// (numbered svc; 0: not numbered, looked up by name).
func (a *proberAssignment) covers(id uuid.UUID, svc int32, service string) bool {
	named := false
	switch {
	case svc <= 0:
		named = a.services[service]
	case int(svc) < len(a.named):
		named = a.named[svc]
	}
	return named || len(a.instances) > 0 && a.instances[id]
}
