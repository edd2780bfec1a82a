package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/seal"
)

// Records of ends (no replay).
//
// A seal proves muster wrote a row once, not that the row is still
// what muster last wrote: an override lifted and set back to 'active'
// with its old bytes, or an ended instance set back to 'active', carries
// a seal that verifies. So whenever muster ends such a row (an override
// lifted or expired, an instance deregistered, expired, replaced or ended
// by reconciliation, a shift completed or cancelled), it also appends, in
// the transaction that ends it, an "end.record" row naming the row's id
// as its target, with the end sealed by the region's key. The readers
// that put rows in force ask Ends for the ids they are about to apply,
// and leave out every row muster has a record of ending: muster's own
// record of the end outranks the row.
//
// The record is in the hash chain, so deleting it (to make a replay
// stick) breaks the chain for `muster audit verify`; it is sealed, so a
// record appended by hand (to end a live row) is not believed.

// ActionEndRecord is the action of a record of an end.
const ActionEndRecord = "end.record"

// Kinds of rows whose ends are recorded (the record's target_kind).
const (
	EndInstance = "instance"
	EndOverride = "override"
	EndShift    = "shift"
)

const endDomain = "muster end record v1"

// End is muster's record that it ended a row.
type End struct {
	Kind    string
	ID      uuid.UUID
	State   string // the state it ended in
	EndedAt time.Time
}

// sealedEnd is what a record's seal covers.
type sealedEnd struct {
	Kind    string `json:"kind"`
	ID      string `json:"id"`
	State   string `json:"state"`
	EndedAt int64  `json:"ended_at"` // microseconds since the epoch
}

func (e End) sealed() sealedEnd {
	return sealedEnd{Kind: e.Kind, ID: e.ID.String(), State: e.State, EndedAt: e.EndedAt.UnixMicro()}
}

// endRecord is the after column of an end.record row.
type endRecord struct {
	sealedEnd
	Seal    []byte  `json:"seal,omitempty"`
	SealKey *string `json:"seal_key,omitempty"`
}

// RecordEnd appends the record of end e with q (the transaction that
// ended the row), sealed by s (nil: unsealed, as muster without a key
// trusts its database).
func RecordEnd(ctx context.Context, q *db.Queries, s seal.Signer, e End) error {
	e.EndedAt = e.EndedAt.UTC().Truncate(time.Microsecond)
	rec := endRecord{sealedEnd: e.sealed()}
	if s != nil {
		sig, kid, err := seal.Sign(ctx, s, endDomain, rec.sealedEnd)
		if err != nil {
			return fmt.Errorf("record the end of %s %s: %w", e.Kind, e.ID, err)
		}
		rec.Seal, rec.SealKey = sig, &kid
	}
	_, err := Append(ctx, q, e.EndedAt, Entry{
		ActorKind: "system", Actor: "system:ends", Action: ActionEndRecord,
		TargetKind: e.Kind, Target: e.ID.String(), Outcome: Accepted,
		Reason: fmt.Sprintf("muster ended %s %s (%s): the row stays ended, even if its earlier bytes are written back", e.Kind, e.ID, e.State),
		After:  rec,
	})
	return err
}

// Ends returns muster's records of ending any of the rows of kind among
// ids whose seal verifies against keys (with no keys, every record
// counts). A record that does not verify (appended by hand) is left out
// and counted in forged. One query, by the audit table's target index.
func Ends(ctx context.Context, q *db.Queries, keys seal.Keys, kind string, ids []uuid.UUID) (ends map[uuid.UUID]End, forged int, err error) {
	if len(ids) == 0 {
		return nil, 0, nil
	}
	strs := make([]string, len(ids))
	for i, id := range ids {
		strs[i] = id.String()
	}
	rows, err := q.AuditEndRecords(ctx, db.AuditEndRecordsParams{TargetKind: kind, Ids: strs})
	if err != nil {
		return nil, 0, fmt.Errorf("read the records of ended %ss: %w", kind, err)
	}
	for _, r := range rows {
		var rec endRecord
		if err := json.Unmarshal(r.After, &rec); err != nil || rec.ID != r.Target || rec.Kind != kind {
			forged++
			continue
		}
		if keys.Verify(endDomain, rec.sealedEnd, rec.Seal, rec.SealKey) != nil {
			forged++
			continue
		}
		id, err := uuid.Parse(rec.ID)
		if err != nil {
			forged++
			continue
		}
		if ends == nil {
			ends = map[uuid.UUID]End{}
		}
		ends[id] = End{Kind: kind, ID: id, State: rec.State, EndedAt: time.UnixMicro(rec.EndedAt).UTC()}
	}
	return ends, forged, nil
}
