package registry

import (
	"context"
	"fmt"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// SealCensus counts, into c, the live instances, the current contracts
// and the member sources by the key that sealed them, and the seal adoptions recorded: the
// registry's part of the start-up key check (seal.Census.Check) and of
// muster seal status.
func SealCensus(ctx context.Context, q *db.Queries, c *seal.Census) error {
	inst, err := q.InstanceSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed instances: %w", err)
	}
	for _, r := range inst {
		c.Add(seal.TableInstances, r.SealKey, r.Rows)
	}
	contracts, err := q.ContractSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed contracts: %w", err)
	}
	for _, r := range contracts {
		c.Add(seal.TableContracts, r.SealKey, r.Rows)
	}
	members, err := q.MemberSourcesSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed member sources: %w", err)
	}
	for _, r := range members {
		c.Add(seal.TableMemberSources, r.SealKey, r.Rows)
	}
	services, err := q.ServiceSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed services: %w", err)
	}
	for _, r := range services {
		c.Add(seal.TableServices, r.SealKey, r.Rows)
	}
	grants, err := q.GrantSealCensus(ctx)
	if err != nil {
		return fmt.Errorf("count sealed grants: %w", err)
	}
	for _, r := range grants {
		c.Add(seal.TableGrants, r.SealKey, r.Rows)
	}
	adoptions, err := q.SealAdoptionList(ctx)
	if err != nil {
		return fmt.Errorf("list seal adoptions: %w", err)
	}
	for _, a := range adoptions {
		c.Adoptions = append(c.Adoptions, fmt.Sprintf("%s by key %s at %s (%d rows)", a.Name, a.KeyID, a.At.UTC().Format("2006-01-02T15:04:05Z"), a.Rows))
	}
	return nil
}
