package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/seal"
)

// Instance seals (package seal; migration 000017).
//
// An instance row is written by muster only: registration, reconciliation
// and replacement insert it; a deregistration (by itself, or by another
// identity through the disruption budget), a replacement, reconciliation
// and the lease reaper end it. Each of those seals what it wrote, in its
// own transaction, with the region's key: the identity when the row is
// inserted (Seal), the end when it is ended (EndSeal). The evaluator asks
// VerifyIdentity before it routes to an instance it does not know yet and
// VerifyEnd before it lets one go, so a row inserted or re-pointed by hand
// gets no traffic, and a row set to 'deregistered' (or 'expired') by hand
// keeps its traffic. A renewal changes neither (the lease is not sealed:
// a lease set into the past by hand is expired by the reaper, under its
// disbelief threshold, like any lapsed lease).
//
// Rows from before the seals are adopted once (AdoptUnsealed).
//
// An end is also recorded in the audit chain (sealEnded, audit.RecordEnd),
// because the seals alone let a row ended by muster be written back to
// its earlier, sealed, active bytes: the evaluator asks Replayed about the
// active rows it is about to route, and routes none muster ended.

const (
	identityDomain = "muster instance identity seal v1"
	endDomain      = "muster instance end seal v1"
	contractDomain = "muster health contract seal v1"
	adoptionName   = "instances"
)

// Health contracts are sealed the same way: when muster writes one
// (PutContract), over its service, version, document (as PostgreSQL
// stores jsonb), author and time. The evaluator applies a contract only if
// its seal verifies (ServiceContract.SealErr): one written by hand (a
// threshold set to drain on the first failure, a minimum healthy fraction
// lowered) is not applied, and the service keeps the contract it had, or
// the platform defaults at a rebuild.

type sealedContract struct {
	Service   string `json:"service"`
	Version   int64  `json:"version"`
	Document  string `json:"document"`
	UpdatedBy string `json:"updated_by"`
	UpdatedAt int64  `json:"updated_at"` // microseconds since the epoch, as stored
}

func contractSealOf(c db.HealthContract) sealedContract {
	return sealedContract{Service: c.Service, Version: c.Version, Document: string(c.Document),
		UpdatedBy: c.UpdatedBy, UpdatedAt: c.UpdatedAt.UnixMicro()}
}

// sealContract seals c as just written with q; without a Sealer it
// returns c unsealed.
func sealContract(ctx context.Context, q *db.Queries, s seal.Signer, c db.HealthContract) (db.HealthContract, error) {
	return seal.Store(ctx, s, contractDomain, "the contract of "+c.Service, contractSealOf(c), c, func(sig []byte, kid *string) (db.HealthContract, error) {
		return q.ContractSeal(ctx, db.ContractSealParams{Service: c.Service, Seal: sig, SealKey: kid})
	})
}

// verifyContract checks c's seal. The evaluator reads every contract on
// each refresh (every second), so seals are remembered (contractSeals) and
// a contract is verified once per change.
func (r *Registry) verifyContract(c db.HealthContract) error {
	return r.contractSeals.Verify(r.trust.For(c.Seal, c.SealKey), contractDomain, contractSealOf(c), c.Seal, c.SealKey)
}

type sealedIdentity struct {
	ID           string `json:"id"`
	Service      string `json:"service"`
	Address      string `json:"address"`
	Port         int32  `json:"port"`
	Zone         string `json:"zone"`
	Region       string `json:"region"`
	Source       string `json:"source"`
	RegisteredBy string `json:"registered_by"`
	CreatedAt    int64  `json:"created_at"` // microseconds since the epoch, as stored
}

type sealedEnd struct {
	ID      string `json:"id"`
	State   string `json:"state"`
	EndedAt int64  `json:"ended_at"`
}

func identityOf(id, service, address string, port int32, zone, region, source, by string, created int64) sealedIdentity {
	return sealedIdentity{ID: id, Service: service, Address: address, Port: port, Zone: zone, Region: region,
		Source: source, RegisteredBy: by, CreatedAt: created}
}

// json is id as the sealed_identity column keeps it.
func (id sealedIdentity) json() []byte {
	b, err := json.Marshal(id)
	if err != nil {
		panic(err) // strings and integers only
	}
	return b
}

func rowIdentity(r db.Instance) sealedIdentity {
	return identityOf(r.ID.String(), r.Service, r.Address, r.Port, r.Zone, r.Region, r.Source, r.RegisteredBy, r.CreatedAt.UnixMicro())
}

func endOf(id, state string, ended int64) sealedEnd {
	return sealedEnd{ID: id, State: state, EndedAt: ended}
}

func rowEnd(r db.Instance) sealedEnd {
	var ended int64
	if r.EndedAt != nil {
		ended = r.EndedAt.UnixMicro()
	}
	return endOf(r.ID.String(), r.State, ended)
}

// insertSealed inserts p with its identity sealed by s (nil: unsealed).
// p.Now must be what PostgreSQL will store (microseconds, as r.now()).
func insertSealed(ctx context.Context, q *db.Queries, s seal.Signer, p db.InstanceInsertParams) (db.Instance, error) {
	if s != nil {
		id := identityOf(p.ID.String(), p.Service, p.Address, p.Port, p.Zone, p.Region, p.Source, p.RegisteredBy, p.Now.UnixMicro())
		sig, kid, err := seal.Sign(ctx, s, identityDomain, id)
		if err != nil {
			return db.Instance{}, fmt.Errorf("seal instance %s: %w", p.ID, err)
		}
		p.Seal, p.SealKey, p.SealedIdentity = sig, &kid, id.json()
	}
	return q.InstanceInsert(ctx, p)
}

// SealCopy seals each row of a bulk load (muster loadgen seed) with s, as
// muster would have written it: its identity, and for an ended row its
// end (EndedAt set). Times must be in microseconds. The rows are signed on
// every core: a seed of a million ended rows is two million signatures.
func SealCopy(ctx context.Context, s seal.Signer, rows []db.InstancesCopyParams) error {
	workers := max(1, min(runtime.GOMAXPROCS(0), len(rows)/256))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(rows) && errs[w] == nil; i += workers {
				errs[w] = sealCopyRow(ctx, s, &rows[i])
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sealCopyRow(ctx context.Context, s seal.Signer, r *db.InstancesCopyParams) error {
	id := identityOf(r.ID.String(), r.Service, r.Address, r.Port, r.Zone, r.Region, r.Source, r.RegisteredBy, r.CreatedAt.UnixMicro())
	sig, kid, err := seal.Sign(ctx, s, identityDomain, id)
	if err != nil {
		return fmt.Errorf("seal instance %s: %w", r.ID, err)
	}
	r.Seal, r.SealKey, r.SealedIdentity = sig, &kid, id.json()
	if r.State == StateActive || r.EndedAt == nil {
		return nil
	}
	esig, ekid, err := seal.Sign(ctx, s, endDomain, endOf(r.ID.String(), r.State, r.EndedAt.UnixMicro()))
	if err != nil {
		return fmt.Errorf("seal the end of instance %s: %w", r.ID, err)
	}
	r.EndSeal, r.EndSealKey = esig, &ekid
	return nil
}

// sealIdentity seals the identity of row as it stands (the adoption).
func sealIdentity(ctx context.Context, q *db.Queries, s seal.Signer, row db.Instance) (db.Instance, error) {
	return seal.Store(ctx, s, identityDomain, "instance "+row.ID.String(), rowIdentity(row), row, func(sig []byte, kid *string) (db.Instance, error) {
		return q.InstanceSeal(ctx, db.InstanceSealParams{ID: row.ID, Seal: sig, SealKey: kid, SealedIdentity: rowIdentity(row).json()})
	})
}

// sealEnded seals the end of row, just ended with q, and records the end
// in the audit chain (audit.RecordEnd), so that the row written back to
// 'active' is never routed again (Registry.Replayed).
func sealEnded(ctx context.Context, q *db.Queries, s seal.Signer, row db.Instance) (db.Instance, error) {
	row, err := sealEnd(ctx, q, s, row)
	if err != nil {
		return row, err
	}
	var ended time.Time
	if row.EndedAt != nil {
		ended = *row.EndedAt
	}
	if err := audit.RecordEnd(ctx, q, s, audit.End{Kind: audit.EndInstance, ID: row.ID, State: row.State, EndedAt: ended}); err != nil {
		return row, err
	}
	return row, nil
}

// sealEnd seals the end of row, just ended with q (or, at the adoption,
// ended before the seals).
func sealEnd(ctx context.Context, q *db.Queries, s seal.Signer, row db.Instance) (db.Instance, error) {
	return seal.Store(ctx, s, endDomain, "the end of instance "+row.ID.String(), rowEnd(row), row, func(sig []byte, kid *string) (db.Instance, error) {
		return q.InstanceSealEnd(ctx, db.InstanceSealEndParams{ID: row.ID, EndSeal: sig, EndSealKey: kid})
	})
}

// sealEndedAll seals the end of every row.
func sealEndedAll(ctx context.Context, q *db.Queries, s seal.Signer, rows []db.Instance) ([]db.Instance, error) {
	for i := range rows {
		var err error
		if rows[i], err = sealEnded(ctx, q, s, rows[i]); err != nil {
			return nil, err
		}
	}
	return rows, nil
}

// seals are an instance's seals as read, kept with it (Instance.seals).
type seals struct {
	seal, endSeal       string
	sealKey, endSealKey *string
	identity            string // sealed_identity: the identity as muster sealed it
}

func sealsOf(r db.Instance) seals {
	return seals{seal: string(r.Seal), sealKey: r.SealKey, endSeal: string(r.EndSeal), endSealKey: r.EndSealKey, identity: string(r.SealedIdentity)}
}

// VerifyIdentity checks that muster inserted in as it stands (its
// service, address, port, zone, region, source, registrant and creation).
// Without keys configured every instance passes.
func (r *Registry) VerifyIdentity(in Instance) error {
	id := identityOf(in.ID.String(), in.Service, in.Address, int32(in.Port), in.Zone, in.Region, in.Source, in.RegisteredBy, in.CreatedAt.UnixMicro())
	return r.trust.For([]byte(in.seals.seal), in.seals.sealKey).Verify(identityDomain, id, []byte(in.seals.seal), in.seals.sealKey)
}

// SealedIdentity returns in as muster sealed it, when its columns were
// changed outside muster (VerifyIdentity fails) but the identity muster
// sealed, kept beside them, verifies: a row re-pointed by hand (another
// address, port, zone or service) is routed where muster put it, and
// never left out for it. It fails when there is no sealed identity, or
// it does not verify either.
func (r *Registry) SealedIdentity(in Instance) (Instance, error) {
	if in.seals.identity == "" {
		return in, errors.New("no sealed identity kept beside the row")
	}
	var id sealedIdentity
	if err := json.Unmarshal([]byte(in.seals.identity), &id); err != nil {
		return in, fmt.Errorf("its sealed identity does not parse: %w", err)
	}
	if id.ID != in.ID.String() {
		return in, fmt.Errorf("its sealed identity is another instance's (%s)", id.ID)
	}
	if err := r.trust.For([]byte(in.seals.seal), in.seals.sealKey).Verify(identityDomain, id, []byte(in.seals.seal), in.seals.sealKey); err != nil {
		return in, fmt.Errorf("its sealed identity does not verify either: %w", err)
	}
	out := in
	out.Service, out.Address, out.Port, out.Zone, out.Region = id.Service, id.Address, int(id.Port), id.Zone, id.Region
	out.Source, out.RegisteredBy, out.CreatedAt = id.Source, id.RegisteredBy, time.UnixMicro(id.CreatedAt).UTC()
	return out, nil
}

// VerifyEnd checks that muster ended in as it stands (its state and end
// time). Without keys configured every instance passes.
func (r *Registry) VerifyEnd(in Instance) error {
	var ended int64
	if in.EndedAt != nil {
		ended = in.EndedAt.UnixMicro()
	}
	return r.trust.For([]byte(in.seals.endSeal), in.seals.endSealKey).Verify(endDomain, endOf(in.ID.String(), in.State, ended), []byte(in.seals.endSeal), in.seals.endSealKey)
}

// AdoptUnsealed seals, once per database, every instance row from before
// the seals as it stands (trust on first use), and records the adoption
// (seal_adoptions, and, when there was any row, an accepted
// registry.seal_adopt audit row with the count). Later calls, on any
// replica, do nothing. A database in which some instance is sealed
// already is never adopted: its record of the adoption was deleted by
// hand, so the attempt is refused and audited, and the unsealed rows stay
// refused. Without a Sealer it does nothing: there is nothing to adopt
// with.
func (r *Registry) AdoptUnsealed(ctx context.Context) (adopted int, err error) {
	s := r.cfg.Sealer
	if s == nil {
		return 0, nil
	}
	refused := false
	err = db.WithTx(ctx, r.cfg.Pool, func(q *db.Queries) error {
		if err := q.SealAdoptionLock(ctx, adoptionName); err != nil {
			return fmt.Errorf("lock the seal adoption: %w", err)
		}
		if _, err := q.SealAdoptionGet(ctx, adoptionName); err == nil {
			return nil
		} else if !notFound(err) {
			return fmt.Errorf("read the seal adoption: %w", err)
		}
		// No record of an adoption, yet rows muster sealed: the record was
		// deleted, which only someone writing the database by hand does
		// (to have rows of theirs adopted). Adopt nothing; the unsealed
		// rows stay refused and alarmed.
		sealed, err := q.InstanceAnySealed(ctx)
		if err != nil {
			return fmt.Errorf("look for sealed instances: %w", err)
		}
		sealedContracts, err := q.ContractAnySealed(ctx)
		if err != nil {
			return fmt.Errorf("look for sealed contracts: %w", err)
		}
		if sealed || sealedContracts {
			refused = true
			return nil
		}
		rows, err := q.InstanceListUnsealed(ctx)
		if err != nil {
			return fmt.Errorf("list unsealed instances: %w", err)
		}
		contracts, err := q.ContractListUnsealed(ctx)
		if err != nil {
			return fmt.Errorf("list unsealed contracts: %w", err)
		}
		for _, c := range contracts {
			if _, err := sealContract(ctx, q, s, c); err != nil {
				return err
			}
		}
		for _, row := range rows {
			if row.Seal == nil {
				if row, err = sealIdentity(ctx, q, s, row); err != nil {
					return err
				}
			}
			if row.State != StateActive && row.EndSeal == nil {
				if _, err = sealEnd(ctx, q, s, row); err != nil {
					return err
				}
			}
		}
		now := r.now()
		if err := q.SealAdoptionInsert(ctx, db.SealAdoptionInsertParams{Name: adoptionName, KeyID: s.KeyID(), Rows: int64(len(rows) + len(contracts)), At: now}); err != nil {
			return fmt.Errorf("record the seal adoption: %w", err)
		}
		adopted = len(rows) + len(contracts)
		if adopted == 0 {
			return nil // a new database: nothing was trusted on first use
		}
		_, err = audit.Append(ctx, q, now, audit.Entry{
			ActorKind: "system", Actor: "system:registry", Action: "registry.seal_adopt",
			TargetKind: "table", Target: adoptionName, Outcome: audit.Accepted,
			Reason: fmt.Sprintf("sealed %d instance rows and %d health contracts from before the seals with key %s (trust on first use); from now on an unsealed instance gets no traffic and keeps its traffic when ended by hand, and an unsealed contract is not applied", len(rows), len(contracts), s.KeyID()),
		})
		return err
	})
	if err != nil {
		return 0, err
	}
	if refused {
		const why = "the record of the seal adoption is gone although instances were sealed: it was deleted by hand, so no unsealed row is adopted"
		r.cfg.Logger.Error(why)
		if _, err := audit.AppendAlone(ctx, r.cfg.Pool, r.now(), audit.Entry{
			ActorKind: "system", Actor: "system:registry", Action: "registry.seal_adopt",
			TargetKind: "table", Target: adoptionName, Outcome: audit.Refused, Reason: why,
		}); err != nil {
			return 0, fmt.Errorf("audit the refused seal adoption: %w", err)
		}
		r.adoptedInstances.Store(true) // seen through: refused once, not at every write
		return 0, nil
	}
	if adopted > 0 {
		r.cfg.Logger.Warn("adopted instance rows from before the seals", "rows", adopted, "key_id", s.KeyID())
	}
	r.adoptedInstances.Store(true)
	return adopted, nil
}

// beforeSealing sees the adoptions of the rows from before the seals
// (AdoptUnsealed, adoptAuthz) through, once per process, before a write
// that creates a sealed row. Without it, the first writes to a new
// database (a registration accepted before the evaluator's rebuild
// adopts) leave sealed rows and no record of an adoption, which the
// adoption then takes for a record deleted by hand: a false alarm, and
// an upgraded database's unsealed rows never adopted. Writes that only
// end or change sealed rows need no gate: a sealed row exists only once
// some process has been through here.
func (r *Registry) beforeSealing(ctx context.Context) error {
	if r.cfg.Sealer == nil {
		return nil
	}
	if !r.adoptedInstances.Load() {
		if _, err := r.AdoptUnsealed(ctx); err != nil {
			return fmt.Errorf("adopt the instance rows from before the seals: %w", err)
		}
	}
	if !r.adoptedAuthz.Load() {
		if _, err := r.adoptAuthz(ctx); err != nil {
			return fmt.Errorf("adopt the services and grants from before the seals: %w", err)
		}
	}
	return nil
}

// EndsOnRecord returns, among ids, the instances muster has a record of
// ending (audit.Ends), whatever their rows read now; forged counts the
// records that do not verify.
func (r *Registry) EndsOnRecord(ctx context.Context, ids []uuid.UUID) (ends map[uuid.UUID]audit.End, forged int, err error) {
	return audit.Ends(ctx, db.New(r.cfg.Pool), r.trust.Keys(), audit.EndInstance, ids)
}

// Replayed returns, among ids, the instances muster has a record of
// ending (audit.Ends): a row of one of them that reads 'active' was
// written back by hand and must not be routed. One query; the evaluator
// asks only for the active rows it is about to put in rotation. forged
// counts records of ends that do not verify (appended by hand): they are
// not believed.
//
// A row the caller read active a moment before muster ended it (on
// this replica or another: a re-registration replacing it) also has a
// record of its end by now; it is a stale read, not a replay. So the
// instances with a record are read again, and only those whose row still
// reads active are returned (three replicas under churn logged
// such races as rows written back by hand).
func (r *Registry) Replayed(ctx context.Context, ids []uuid.UUID) (ends map[uuid.UUID]audit.End, forged int, err error) {
	q := db.New(r.cfg.Pool)
	ends, forged, err = r.EndsOnRecord(ctx, ids)
	if err != nil || len(ends) == 0 {
		return ends, forged, err
	}
	states, err := InstanceStates(ctx, q, slices.Collect(maps.Keys(ends)))
	if err != nil {
		return nil, forged, err
	}
	for id := range ends {
		if states[id] != StateActive {
			delete(ends, id)
		}
	}
	return ends, forged, nil
}
