package registry

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/refusal"
	"github.com/musterhq/muster/internal/seal"
)

// SourceRegistered marks instances that came through the registration API;
// orchestrator-reconciled instances carry the orchestrator's name.
const SourceRegistered = "registered"

// Instance states. Only active instances can be routed to; the others are
// kept so an id is never reused.
const (
	StateActive       = "active"
	StateDeregistered = "deregistered"
	StateExpired      = "expired"
	StateReplaced     = "replaced"
)

// Instance is one endpoint of a service.
type Instance struct {
	ID             uuid.UUID  `json:"id"`
	Service        string     `json:"service"`
	Address        string     `json:"address"`
	Port           int        `json:"port"`
	Zone           string     `json:"zone"`
	Region         string     `json:"region"`
	Source         string     `json:"source"`
	State          string     `json:"state"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	RegisteredBy   string     `json:"registered_by"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	EndedAt        *time.Time `json:"ended_at,omitempty"`

	seals seals // as read: VerifyIdentity and VerifyEnd check them
	// credential is the hash of the instance's credential (credential.go);
	// credentialProven that the instance has presented it in a renewal.
	credential       CredentialHash
	credentialProven bool
}

// Registered is a registration's answer: the instance and, when a
// workload registered it, its credential. The credential is shown once,
// here; muster keeps only its hash.
type Registered struct {
	Instance
	// Credential is the instance's secret, for the CredentialHeader of its
	// renewals, its own deregistration and its self-reports; empty when
	// the instance has none (an endpoint an operator declared).
	Credential string `json:"credential,omitempty"`
}

// Registration is what a runtime asks to register.
type Registration struct {
	Address string `json:"address"`
	Port    int    `json:"port"`
	Zone    string `json:"zone"`
	// Region defaults to this muster's region; another region is refused,
	// since each region's muster is the authority for its own (ADR-14).
	Region string `json:"region,omitempty"`
}

func (r *Registry) validateRegistration(reg *Registration) (netip.Addr, []FieldError) {
	var fe []FieldError
	addr, err := netip.ParseAddr(reg.Address)
	if err != nil || addr.Zone() != "" {
		fe = append(fe, FieldError{Field: "address", Message: fmt.Sprintf("must be an IPv4 or IPv6 address, got %q", reg.Address)})
	} else {
		addr = addr.Unmap()
		reg.Address = addr.String()
		if addr.IsUnspecified() || addr.IsMulticast() {
			fe = append(fe, FieldError{Field: "address", Message: fmt.Sprintf("%s cannot receive traffic", addr)})
		}
	}
	if reg.Port < 1 || reg.Port > 65535 {
		fe = append(fe, FieldError{Field: "port", Message: fmt.Sprintf("must be between 1 and 65535, got %d", reg.Port)})
	}
	if !ValidName(reg.Zone) {
		fe = append(fe, FieldError{Field: "zone", Message: fmt.Sprintf("must be a DNS label such as az1, got %q", reg.Zone)})
	}
	if reg.Region == "" {
		reg.Region = r.cfg.Region
	} else if reg.Region != r.cfg.Region {
		fe = append(fe, FieldError{Field: "region", Message: fmt.Sprintf("this muster is the authority for region %s only, got %q", r.cfg.Region, reg.Region)})
	}
	return addr, fe
}

// Register is RegisterWithCredential without the credential, for callers
// inside muster and its tests that act for no instance.
func (r *Registry) Register(ctx context.Context, actor identity.Principal, source netip.Addr, service string, reg Registration) (Instance, error) {
	out, err := r.RegisterWithCredential(ctx, actor, source, service, reg)
	return out.Instance, err
}

// RegisterWithCredential records a new instance of service with a lease of LeaseTTL. A
// workload may register only into its own service, and only an address it
// is proved to hold: the request's source address, or one its token lists
// (ADR-15). The service's own operators and admins may register endpoints
// on its behalf (declared external endpoints). A live instance already
// holding the same address and port is ended as replaced: a restarted
// process is a new instance (ADR-03).
//
// An instance a workload registers (the instance itself) gets a
// credential (credential.go), returned here once and stored as its hash;
// an endpoint an operator declares has no process of its own to hold one
// and gets none.
func (r *Registry) RegisterWithCredential(ctx context.Context, actor identity.Principal, source netip.Addr, service string, reg Registration) (Registered, error) {
	const action = "instance.register"
	target := service
	var (
		out      Instance
		secret   string
		replaced []Instance
	)
	err := r.write(ctx, actor, action, "service", target, reg, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.ServiceGet(ctx, service)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no service named %s", service), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", service, err)
		}
		svc := r.service(row)
		if rerr := mayRegister(actor, svc); rerr != nil {
			return rerr, nil
		}
		addr, fe := r.validateRegistration(&reg)
		if len(fe) > 0 {
			return invalid("the registration is not valid", fe), nil
		}
		if rerr := proveAddress(actor, addr, source); rerr != nil {
			return rerr, nil
		}
		if rerr, err := refuseReconciledEndpoint(ctx, q, service, reg.Address, reg.Port); rerr != nil || err != nil {
			return rerr, err
		}
		// Row stamps (created, updated, ended) and the lease are on the
		// database's clock: the other replicas' evaluators read changes by
		// updated_at, and a stamp from a clock behind theirs would be
		// behind what they have read.
		now, err := r.leaseNow(ctx, q)
		if err != nil {
			return nil, err
		}
		ended, err := q.InstanceEndLiveEndpoint(ctx, db.InstanceEndLiveEndpointParams{Service: service, Address: reg.Address, Port: int32(reg.Port), Now: now})
		if err != nil {
			return nil, fmt.Errorf("end replaced instances: %w", err)
		}
		if ended, err = sealEndedAll(ctx, q, r.cfg.Sealer, ended); err != nil {
			return nil, err
		}
		for _, old := range ended {
			after := instanceFromRow(old)
			before := after
			before.State, before.EndedAt = StateActive, nil
			e := accepted(actor, "instance.replace", "instance", old.ID.String(), before, after)
			if _, err := audit.Append(ctx, q, now, e); err != nil {
				return nil, err
			}
			replaced = append(replaced, after)
		}
		id, err := uuid.NewV7()
		if err != nil {
			return nil, fmt.Errorf("new instance id: %w", err)
		}
		var hash []byte
		if actor.Kind == identity.KindWorkload {
			if secret, hash, err = newCredential(); err != nil {
				return nil, err
			}
		}
		expires := now.Add(r.cfg.LeaseTTL)
		ins, err := insertSealed(ctx, q, r.cfg.Sealer, db.InstanceInsertParams{
			ID: id, Service: service, Address: reg.Address, Port: int32(reg.Port),
			Zone: reg.Zone, Region: reg.Region, Source: SourceRegistered,
			LeaseExpiresAt: &expires, RegisteredBy: actor.String(), Now: now,
			CredentialHash: hash,
		})
		if err != nil {
			return nil, fmt.Errorf("insert instance: %w", err)
		}
		out = instanceFromRow(ins)
		_, err = audit.Append(ctx, q, now, accepted(actor, action, "instance", id.String(), nil, out))
		return nil, err
	})
	if err != nil {
		return Registered{}, err
	}
	r.metrics.registrations.Inc()
	if f := r.following(); f != nil {
		f.InstancesRegistered(ctx, append(replaced, out))
	}
	return Registered{Instance: out, Credential: secret}, nil
}

// mayRegister checks who may register into svc at all.
func mayRegister(actor identity.Principal, svc Service) *refusal.Error {
	if actor.Kind != identity.KindWorkload {
		if CanManage(actor, svc.Owner) {
			return nil
		}
		return newRefusal(ErrForbidden, "registering into %s needs a workload identity of that service, or the %s team's operator role or admin; %s has none of these", svc.Name, svc.Owner, actor)
	}
	if actor.Service != svc.Name {
		return newRefusal(ErrForbidden, "workload %s belongs to service %s and may not register instances of %s", actor, actor.Service, svc.Name)
	}
	return nil
}

// proveAddress checks that a workload registers an address it holds: the
// request's source address, or one its token vouches for (ADR-15).
// Operators and admins declaring endpoints need no proof.
func proveAddress(actor identity.Principal, addr, source netip.Addr) *refusal.Error {
	if actor.Kind != identity.KindWorkload || HoldsAddress(actor, addr, source) {
		return nil
	}
	src := "unknown"
	if source.IsValid() {
		src = source.Unmap().String()
	}
	return newRefusal(ErrForbidden, "address %s is not proved to belong to %s: the request came from %s and the token (or client certificate) lists no such address; register from the instance itself, or use a token whose muster_addresses claim, or a client certificate whose IP SANs, include it", addr, actor, src)
}

// HoldsAddress reports whether actor is proved to hold addr: the request
// came from addr (source, the TCP peer), or actor's token vouches for it
// (muster_addresses), or, for a workload authenticated by its client
// certificate, the certificate's IP SANs do (identity.TrustDomains: the
// CA vouches for them as an issuer does for its claim). It is the proof Register asks of a workload, and
// what tells an instance deregistering itself from anyone else doing it
// (policy.Service.Deregister).
func HoldsAddress(actor identity.Principal, addr, source netip.Addr) bool {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return false
	}
	if source.IsValid() && source.Unmap() == addr {
		return true
	}
	return slices.ContainsFunc(actor.Addresses, func(a netip.Addr) bool { return a.Unmap() == addr })
}

// Renew extends an active registered instance's lease by LeaseTTL from now.
// Only workloads of the instance's service (and its operators and admins)
// may renew. A lease that has lapsed but whose instance the reaper has not
// ended (held by the grace after muster's or PostgreSQL's outage, the
// expiry delay, or a disbelief threshold) is renewed as if on time: the
// instance keeps its id. An ended instance cannot be renewed:
// re-registering gives a new id. Successful renewals are not audited (they
// are not policy changes and arrive every few seconds per instance);
// refused ones are.
//
// Renew is RenewWithCredential with no credential presented.
func (r *Registry) Renew(ctx context.Context, actor identity.Principal, id uuid.UUID) (Instance, error) {
	return r.RenewWithCredential(ctx, actor, id, Credential{})
}

// RenewWithCredential renews as Renew does, cred being the credential the
// caller presented (credential.go). A workload renewing an instance that
// has a credential:
//
//   - with the instance's credential renews it, and from then on the
//     instance needs its credential to renew;
//   - with another credential (a sibling's) is refused: it is not this
//     instance;
//   - with none is accepted, and counted in
//     muster_lease_renewals_without_credential_total, until the instance
//     has once renewed with its credential; after that it is refused.
//
// The last rule is for clients from before credentials, which register
// (and get a credential they do not keep) and renew without one: muster
// must never be what stops their traffic, and a renewal can only keep an
// instance, never remove one, so such a renewal is let through. Once the
// instance has shown it holds its credential a renewal without it cannot
// be the instance's, and a sibling cannot keep a dead neighbour's lease
// alive. Operators and admins renew as before, credential or not.
func (r *Registry) RenewWithCredential(ctx context.Context, actor identity.Principal, id uuid.UUID, cred Credential) (Instance, error) {
	without := false
	out, err := r.changeInstance(ctx, actor, id, "lease.renew", func(q *db.Queries, cur Instance, now time.Time) (Instance, bool, error) {
		proven, w, rerr := leaseCheck(actor, cur, cred)
		if rerr != nil {
			return Instance{}, false, rerr
		}
		without = w
		row, err := q.LeaseRenew(ctx, db.LeaseRenewParams{ID: id, At: r.leaseAt(), LifetimeUs: r.cfg.LeaseTTL.Microseconds(), Proven: proven})
		if err != nil {
			return Instance{}, false, fmt.Errorf("renew lease %s: %w", id, err)
		}
		return instanceFromRow(row), false, nil
	})
	if err == nil && without {
		r.metrics.renewalsWithoutCredential.Inc()
	}
	return out, err
}

// Deregister ends an instance gracefully; it is then never routed to again.
// Deregistering an instance that has already ended changes nothing. It
// checks who may act on the instance, not the disruption budget: the API
// and the UI deregister through policy.Service.Deregister, where only the
// instance itself is let through without the override checks.
// This is for callers inside muster and its tests.
func (r *Registry) Deregister(ctx context.Context, actor identity.Principal, id uuid.UUID) (Instance, error) {
	return r.changeInstance(ctx, actor, id, "instance.deregister", func(q *db.Queries, cur Instance, now time.Time) (Instance, bool, error) {
		// Stamped on the database's clock, as registration is.
		at, err := r.leaseNow(ctx, q)
		if err != nil {
			return Instance{}, false, err
		}
		out, err := EndInstance(ctx, q, r.cfg.Sealer, id, at)
		return out, true, err
	})
}

// LockInstance reads an instance with q, locking its row until q's
// transaction ends; ErrNotFound when there is none. With EndInstance it is
// the storage side of a deregistration decided elsewhere (the policy
// package), in the deciding transaction.
func LockInstance(ctx context.Context, q *db.Queries, id uuid.UUID) (Instance, error) {
	row, err := q.InstanceGetForUpdate(ctx, id)
	if notFound(err) {
		return Instance{}, newRefusal(ErrNotFound, "no instance %s", id)
	}
	if err != nil {
		return Instance{}, fmt.Errorf("read instance %s: %w", id, err)
	}
	return instanceFromRow(row), nil
}

// InstanceStates returns the registry's state of each of ids that exists,
// read with q (the caller's transaction).
func InstanceStates(ctx context.Context, q *db.Queries, ids []uuid.UUID) (map[uuid.UUID]string, error) {
	rows, err := q.InstanceStates(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read the states of %d instances: %w", len(ids), err)
	}
	out := make(map[uuid.UUID]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.State
	}
	return out, nil
}

// EndInstance ends an active instance as deregistered at now, with q (the
// caller's transaction), sealing the end with s (the region's key; nil
// when none is configured). An instance that has already ended is refused
// with ErrGone.
func EndInstance(ctx context.Context, q *db.Queries, s seal.Signer, id uuid.UUID, now time.Time) (Instance, error) {
	row, err := q.InstanceEnd(ctx, db.InstanceEndParams{ID: id, State: StateDeregistered, Now: now})
	if notFound(err) {
		return Instance{}, newRefusal(ErrGone, "instance %s has already ended", id)
	}
	if err != nil {
		return Instance{}, fmt.Errorf("deregister %s: %w", id, err)
	}
	if row, err = sealEnded(ctx, q, s, row); err != nil {
		return Instance{}, err
	}
	return instanceFromRow(row), nil
}

// changeInstance loads and locks an instance, checks that actor may act on
// it, and applies change, auditing a refusal or (when change says so) the
// accepted change.
func (r *Registry) changeInstance(ctx context.Context, actor identity.Principal, id uuid.UUID, action string,
	change func(q *db.Queries, cur Instance, now time.Time) (Instance, bool, error)) (Instance, error) {
	var out Instance
	err := r.write(ctx, actor, action, "instance", id.String(), nil, func(q *db.Queries) (*refusal.Error, error) {
		row, err := q.InstanceGetForUpdate(ctx, id)
		if notFound(err) {
			return newRefusal(ErrNotFound, "no instance %s", id), nil
		}
		if err != nil {
			return nil, fmt.Errorf("read instance %s: %w", id, err)
		}
		cur := instanceFromRow(row)
		svc, err := q.ServiceGet(ctx, cur.Service)
		if err != nil {
			return nil, fmt.Errorf("read service %s: %w", cur.Service, err)
		}
		if rerr := instanceAccess(actor, cur, r.service(svc)); rerr != nil {
			return rerr, nil
		}
		if cur.State != StateActive {
			if action == "instance.deregister" {
				out = cur // already ended: nothing to do, nothing to audit
				return nil, nil
			}
			return newRefusal(ErrGone, "instance %s has ended (%s); register again to get a new instance", id, cur.State), nil
		}
		now := r.now()
		next, audited, err := change(q, cur, now)
		var rerr *refusal.Error
		if errors.As(err, &rerr) {
			return rerr, nil
		}
		if err != nil {
			return nil, err
		}
		out = next
		if audited {
			_, err = audit.Append(ctx, q, now, accepted(actor, action, "instance", id.String(), cur, next))
		}
		return nil, err
	})
	if errors.Is(err, errHidden) {
		return Instance{}, newRefusal(ErrNotFound, "no instance %s", id)
	}
	if err != nil {
		return Instance{}, err
	}
	return out, nil
}

// instanceAccess checks that actor may act on cur, an instance of svc.
// An actor that may not even see the instance is answered as if it did
// not exist (errHidden), so a workload cannot probe for other services'
// instances; the attempt is still audited.
func instanceAccess(actor identity.Principal, cur Instance, svc Service) *refusal.Error {
	if !canReadService(actor, cur.Service) {
		return &refusal.Error{Kind: errHidden, Detail: fmt.Sprintf("%s may not see instances of %s", actor, cur.Service)}
	}
	if !mayActOnInstance(actor, svc) {
		return newRefusal(ErrForbidden, "%s may not change instances of %s: that needs a workload of %s, the %s team's operator role, or admin", actor, cur.Service, cur.Service, svc.Owner)
	}
	return nil
}

// leaseCheck decides a renewal of cur's lease by actor presenting cred,
// once instanceAccess has let actor act on cur and cur is active (see
// RenewWithCredential): proven when the renewal presents the instance's
// credential, without when a workload renews an instance that has one
// without it (and may, not having proven it yet).
func leaseCheck(actor identity.Principal, cur Instance, cred Credential) (proven, without bool, rerr *refusal.Error) {
	if cur.Source != SourceRegistered || cur.LeaseExpiresAt == nil {
		return false, false, newRefusal(ErrConflict, "instance %s comes from %s and has no lease to renew", cur.ID, cur.Source)
	}
	if actor.Kind != identity.KindWorkload {
		return false, false, nil
	}
	switch cur.credential.Check(cred) {
	case CredentialWrong:
		return false, false, newRefusal(ErrForbidden, "the %s presented is not instance %s's: an instance renews its own lease with the credential its registration returned", CredentialHeader, cur.ID)
	case CredentialMissing:
		if cur.credentialProven {
			return false, false, newRefusal(ErrForbidden, "instance %s has renewed with its credential before, so a renewal without one is not the instance's: send the credential its registration returned in the %s header", cur.ID, CredentialHeader)
		}
		return false, true, nil
	case CredentialMatches:
		return true, false, nil
	}
	return false, false, nil
}

// errHidden is a forbidden attempt answered as not found.
var errHidden = refusal.Forbidden.Sub("forbidden (hidden)", "forbidden")

func mayActOnInstance(actor identity.Principal, svc Service) bool {
	if actor.Kind == identity.KindWorkload {
		return actor.Service == svc.Name
	}
	return CanManage(actor, svc.Owner)
}

// GetInstance returns one instance.
func (r *Registry) GetInstance(ctx context.Context, actor identity.Principal, id uuid.UUID) (Instance, error) {
	row, err := db.New(r.cfg.Pool).InstanceGet(ctx, id)
	if notFound(err) {
		return Instance{}, newRefusal(ErrNotFound, "no instance %s", id)
	}
	if err != nil {
		return Instance{}, fmt.Errorf("read instance %s: %w", id, err)
	}
	if !canReadService(actor, row.Service) {
		return Instance{}, newRefusal(ErrNotFound, "no instance %s", id)
	}
	return instanceFromRow(row), nil
}

// InstanceFilter narrows ListInstances.
type InstanceFilter struct {
	// IncludeEnded lists deregistered, expired and replaced instances too.
	IncludeEnded bool
}

// ListInstances returns a service's instances ordered by id, after
// page.After (an instance id; empty for the first page).
func (r *Registry) ListInstances(ctx context.Context, actor identity.Principal, service string, f InstanceFilter, page Page) ([]Instance, error) {
	if _, err := r.GetService(ctx, actor, service); err != nil {
		return nil, err
	}
	after := uuid.Nil
	if page.After != "" {
		var err error
		if after, err = uuid.Parse(page.After); err != nil {
			return nil, invalid("bad page cursor", []FieldError{{Field: "cursor", Message: "not an instance id"}})
		}
	}
	rows, err := db.New(r.cfg.Pool).InstanceListByService(ctx, db.InstanceListByServiceParams{
		Service: service, After: after, IncludeEnded: f.IncludeEnded, Lim: page.limit(),
	})
	if err != nil {
		return nil, fmt.Errorf("list instances of %s: %w", service, err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}

// InstancesDuring returns a service's instances that were registered at
// some time in [since, until), live or ended, ordered by id after
// page.After: the rows of its timeline.
func (r *Registry) InstancesDuring(ctx context.Context, actor identity.Principal, service string, since, until time.Time, page Page) ([]Instance, error) {
	if _, err := r.GetService(ctx, actor, service); err != nil {
		return nil, err
	}
	after := uuid.Nil
	if page.After != "" {
		var err error
		if after, err = uuid.Parse(page.After); err != nil {
			return nil, invalid("bad page cursor", []FieldError{{Field: "cursor", Message: "not an instance id"}})
		}
	}
	rows, err := db.New(r.cfg.Pool).InstanceListDuring(ctx, db.InstanceListDuringParams{
		Service: service, After: after, Since: since, Until: until, Lim: page.limit(),
	})
	if err != nil {
		return nil, fmt.Errorf("list instances of %s during [%s, %s): %w", service, since.Format(time.RFC3339), until.Format(time.RFC3339), err)
	}
	out := make([]Instance, len(rows))
	for i, row := range rows {
		out[i] = instanceFromRow(row)
	}
	return out, nil
}

func instanceFromRow(row db.Instance) Instance {
	return Instance{
		ID: row.ID, Service: row.Service, Address: row.Address, Port: int(row.Port),
		Zone: row.Zone, Region: row.Region, Source: row.Source, State: row.State,
		LeaseExpiresAt: row.LeaseExpiresAt, RegisteredBy: row.RegisteredBy,
		CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, EndedAt: row.EndedAt,
		seals:      sealsOf(row),
		credential: credentialHashOf(row.CredentialHash), credentialProven: row.CredentialProven,
	}
}

// ReadInstance returns an instance, ended or not, read with q (the
// caller's transaction); found is false when there is no such instance.
// Other packages read the registry's tables only through functions like
// this one, so the registry alone knows its rows.
func ReadInstance(ctx context.Context, q *db.Queries, id uuid.UUID) (ins Instance, found bool, err error) {
	row, err := q.InstanceGet(ctx, id)
	if notFound(err) {
		return Instance{}, false, nil
	}
	if err != nil {
		return Instance{}, false, fmt.Errorf("read instance %s: %w", id, err)
	}
	return instanceFromRow(row), true, nil
}

// ServicesInZone lists the services with live instances in zone, read
// with q (the caller's transaction).
func ServicesInZone(ctx context.Context, q *db.Queries, zone string) ([]string, error) {
	services, err := q.InstanceServicesInZone(ctx, zone)
	if err != nil {
		return nil, fmt.Errorf("list services in zone %s: %w", zone, err)
	}
	return services, nil
}
