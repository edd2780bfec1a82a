package seal

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The tables whose live rows carry seals, as a Census names them.
const (
	TableInstances = "instances"
	TableContracts = "contracts"
	TableOverrides = "overrides"
	TableShifts    = "shifts"
	// TableMemberSources are the services' member sources (who may
	// supply their members from reconciliation).
	TableMemberSources = "member_sources"
	// TableServices and TableGrants are who owns a service and who may
	// resolve it (grants with their sealed tombstones).
	TableServices = "services"
	TableGrants   = "grants"
)

// Unsealed is the key id a Census files rows without a seal under.
const Unsealed = ""

// DefaultMismatchShare is the share of a database's live sealed rows that
// may be sealed by keys a starting replica does not trust before it
// refuses to start: above it, the keys are misconfigured (a rotated,
// lost or replaced key), not a few rows forged by hand.
const DefaultMismatchShare = 0.05

// Census counts a database's live sealed rows (active instances, current
// contracts, overrides and shifts in force) by the key that sealed them,
// and the seal adoptions recorded (a database once keyed stays keyed).
// The owning packages fill it (registry.SealCensus, policy.SealCensus,
// shift.SealCensus); Check decides whether a replica with a given set of
// keys may start on it.
type Census struct {
	// Rows maps table -> key id (Unsealed for none) -> rows.
	Rows map[string]map[string]int64
	// Adoptions names the seal adoptions recorded, with their keys.
	Adoptions []string
}

// Add counts n rows of table sealed by keyID (nil: unsealed).
func (c *Census) Add(table string, keyID *string, n int64) {
	if c.Rows == nil {
		c.Rows = map[string]map[string]int64{}
	}
	if c.Rows[table] == nil {
		c.Rows[table] = map[string]int64{}
	}
	k := Unsealed
	if keyID != nil {
		k = *keyID
	}
	c.Rows[table][k] += n
}

// ByKey totals the rows each key sealed, over every table (Unsealed
// included).
func (c Census) ByKey() map[string]int64 {
	out := map[string]int64{}
	for _, keys := range c.Rows {
		for k, n := range keys {
			out[k] += n
		}
	}
	return out
}

// Sealed is how many live rows carry a seal of any key.
func (c Census) Sealed() int64 {
	var n int64
	for k, rows := range c.ByKey() {
		if k != Unsealed {
			n += rows
		}
	}
	return n
}

// Untrusted totals, per key id that keys lacks, the rows it sealed.
func (c Census) Untrusted(keys Keys) map[string]int64 {
	out := map[string]int64{}
	for k, n := range c.ByKey() {
		if _, ok := keys[k]; !ok && k != Unsealed {
			out[k] = n
		}
	}
	return out
}

// ErrKeyMismatch: the keys a replica holds do not verify the database's
// rows (a rotated, lost or replaced key). ErrKeyless: a replica without
// a key was started on a database whose rows are sealed.
var (
	ErrKeyMismatch = errors.New("the region's keys do not verify the database's sealed rows")
	ErrKeyless     = errors.New("no signing key, and the database's rows are sealed")
)

// Check says whether a replica trusting keys (none: a keyless replica)
// may start on the database c counts. A keyless replica may not once any
// row is sealed or an adoption is recorded: what it wrote would be
// refused by the keyed replicas, and what it ended would come back. A
// keyed replica may not when more than share of the live sealed rows are
// sealed by keys it does not trust: it would route none of those
// instances, drop those overrides, end those drains and forget those
// contracts. Below share, the untrusted rows are refused and alarmed one
// by one, as rows written by hand are.
func (c Census) Check(keys Keys, share float64) error {
	sealed := c.Sealed()
	if len(keys) == 0 {
		if sealed == 0 && len(c.Adoptions) == 0 {
			return nil
		}
		what := fmt.Sprintf("%d live rows are sealed (%s)", sealed, c.describe(nil))
		if len(c.Adoptions) > 0 {
			what += "; seal adoptions recorded: " + strings.Join(c.Adoptions, ", ")
		}
		return fmt.Errorf("%w: %s. A replica without the region's key would write rows the keyed replicas refuse and act on rows they refused. "+
			"Set MUSTER_AUDIT_SIGNING_KEY_FILE to the region's signing key (docs/keys.md)", ErrKeyless, what)
	}
	untrusted := c.Untrusted(keys)
	var n int64
	for _, rows := range untrusted {
		n += rows
	}
	if n == 0 || float64(n) <= share*float64(sealed) {
		return nil
	}
	ids := slices.Sorted(maps.Keys(untrusted))
	trusted := slices.Sorted(maps.Keys(keys))
	return fmt.Errorf("%w: %d of the %d live sealed rows (%s) are sealed by key %s, which this replica neither holds nor trusts (it trusts %s); "+
		"more than %g%% untrusted is a key misconfigured, not rows forged by hand, so muster will not start and route around them. "+
		"Give this replica the key that sealed them (MUSTER_AUDIT_SIGNING_KEY_FILE) or its public half (MUSTER_AUDIT_PUBLIC_KEY_FILES); "+
		"to retire that key, trust both and re-seal (docs/keys.md); 'muster seal status' lists the rows each key covers",
		ErrKeyMismatch, n, sealed, c.describe(untrusted), strings.Join(ids, ", "), strings.Join(trusted, ", "), share*100)
}

// describe lists the rows per table, of the keys in only (nil: every
// sealed row).
func (c Census) describe(only map[string]int64) string {
	var parts []string
	for _, table := range []string{TableInstances, TableContracts, TableOverrides, TableShifts, TableMemberSources, TableServices, TableGrants} {
		var n int64
		for k, rows := range c.Rows[table] {
			if k == Unsealed {
				continue
			}
			if _, ok := only[k]; only == nil || ok {
				n += rows
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", table, n))
		}
	}
	return strings.Join(parts, ", ")
}
