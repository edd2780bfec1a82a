package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// muster seal rotate's batches of the registry's tables (seal.ResealRows):
// each reads up to limit rows after the cursor whose seal is by another
// key, locked, and re-seals those whose seal verifies under keys with s.

// ResealInstances re-seals the identity of active instances, by id after
// after (uuid.Nil: from the start). An ended instance keeps its seals: it
// is never routed again whichever key they are by, and its end is only
// read by replicas that knew it active.
func ResealInstances(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after uuid.UUID, limit int) (seal.Batch, error) {
	rows, err := q.InstanceResealBatch(ctx, db.InstanceResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read instances to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, identityDomain, rows, limit, func(r db.Instance) seal.Row {
		// A row re-pointed by hand keeps the identity muster sealed
		// (sealed_identity): that is what is re-sealed, so the rotation
		// does not drop it either.
		id := rowIdentity(r)
		if keys.Verify(identityDomain, id, r.Seal, r.SealKey) != nil {
			var kept sealedIdentity
			if json.Unmarshal(r.SealedIdentity, &kept) == nil && kept.ID == r.ID.String() {
				id = kept
			}
		}
		return seal.Row{Name: "instance " + r.ID.String(), Value: id, Sig: r.Seal, KeyID: r.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.InstanceReseal(ctx, db.InstanceResealParams{ID: r.ID, Seal: sig, SealKey: &kid, OldSeal: r.Seal, SealedIdentity: id.json()})
				return n == 1, err
			}}
	}, func(r db.Instance) string { return r.ID.String() })
}

// ResealContracts re-seals the services' health contracts, by service
// name after after ("" from the start).
func ResealContracts(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after string, limit int) (seal.Batch, error) {
	rows, err := q.ContractResealBatch(ctx, db.ContractResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read contracts to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, contractDomain, rows, limit, func(c db.HealthContract) seal.Row {
		return seal.Row{Name: "the contract of " + c.Service, Value: contractSealOf(c), Sig: c.Seal, KeyID: c.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.ContractReseal(ctx, db.ContractResealParams{Service: c.Service, Version: c.Version, Seal: sig, SealKey: &kid, OldSeal: c.Seal})
				return n == 1, err
			}}
	}, func(c db.HealthContract) string { return c.Service })
}

// ResealMemberSources re-seals the services' member sources, by service
// name after after ("" from the start).
func ResealMemberSources(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after string, limit int) (seal.Batch, error) {
	rows, err := q.MemberSourcesResealBatch(ctx, db.MemberSourcesResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read member sources to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, memberSourcesDomain, rows, limit, func(m db.MemberSource) seal.Row {
		return seal.Row{Name: "the member sources of " + m.Service, Value: memberSourcesSealOf(m.Service, m.Version, m.Document, m.UpdatedBy, m.UpdatedAt),
			Sig: m.Seal, KeyID: m.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.MemberSourcesReseal(ctx, db.MemberSourcesResealParams{Service: m.Service, Version: m.Version, Seal: sig, SealKey: &kid, OldSeal: m.Seal})
				return n == 1, err
			}}
	}, func(m db.MemberSource) string { return m.Service })
}

// ResealServices re-seals the services (name, owner and capabilities), by
// name after after ("" from the start).
func ResealServices(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after string, limit int) (seal.Batch, error) {
	rows, err := q.ServiceResealBatch(ctx, db.ServiceResealBatchParams{KeyID: s.KeyID(), After: after, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read services to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, serviceDomain, rows, limit, func(r db.Service) seal.Row {
		return seal.Row{Name: "service " + r.Name, Value: serviceSealOf(r), Sig: r.Seal, KeyID: r.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.ServiceReseal(ctx, db.ServiceResealParams{Name: r.Name, Seal: sig, SealKey: &kid, OldSeal: r.Seal})
				return n == 1, err
			}}
	}, func(r db.Service) string { return r.Name })
}

// ResealGrants re-seals the grant rows and their sealed tombstones, after
// the cursor after ("" from the start; "service\ncaller" as Batch.Next
// gives it).
func ResealGrants(ctx context.Context, q *db.Queries, s seal.Signer, keys seal.Keys, after string, limit int) (seal.Batch, error) {
	svc, caller, _ := strings.Cut(after, "\n")
	rows, err := q.GrantResealBatch(ctx, db.GrantResealBatchParams{KeyID: s.KeyID(), AfterService: svc, AfterCaller: caller, Lim: int32(limit)})
	if err != nil {
		return seal.Batch{}, fmt.Errorf("read grants to re-seal: %w", err)
	}
	return seal.ResealRows(ctx, s, keys, grantDomain, rows, limit, func(g db.ServiceGrant) seal.Row {
		return seal.Row{Name: "the grant of " + g.Service + " to " + g.Caller, Value: grantSealOf(g), Sig: g.Seal, KeyID: g.SealKey,
			Store: func(sig []byte, kid string) (bool, error) {
				n, err := q.GrantReseal(ctx, db.GrantResealParams{Service: g.Service, Caller: g.Caller, Version: g.Version, Seal: sig, SealKey: &kid, OldSeal: g.Seal})
				return n == 1, err
			}}
	}, func(g db.ServiceGrant) string { return g.Service + "\n" + g.Caller })
}
