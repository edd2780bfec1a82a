package audit

import (
	"bytes"
	"context"
	"fmt"

	"github.com/musterhq/muster/db"
)

// VerifyCheckpoints verifies the chain (as Verify does, in Go) and checks
// it against every checkpoint, oldest first (cps as LoadCheckpoints
// returns them): the row each checkpoint names must still hash to the head
// it recorded, and the table must still reach the newest checkpoint's seq.
// It fails with a *BrokenError naming the row and the checkpoint:
//   - "content", "link" or "gap": a row was changed, or removed, and the
//     chain was not re-hashed after it (Verify alone finds these);
//   - "rewritten": the table is self-consistent but a checkpoint saw a
//     different row at its seq: rows after the previous checkpoint, up
//     to this one's seq, were rewritten and every later row re-chained;
//   - "rollback": the table ends before a checkpoint's seq: rows were
//     deleted from the tail, or the database was restored to an earlier
//     point (LostFrom..LostTo are the seqs lost).
func VerifyCheckpoints(ctx context.Context, q *db.Queries, cps []Checkpoint) (Report, error) {
	i := 0
	for i < len(cps) && cps[i].Seq == 0 {
		i++
	}
	rep, err := walk(ctx, q, 0, genesis, func(r Row) error {
		for ; i < len(cps) && cps[i].Seq == r.Seq; i++ {
			if c := cps[i]; !bytes.Equal(c.Head, r.Hash) {
				after := int64(0)
				for j := i - 1; j >= 0; j-- {
					if cps[j].Seq < r.Seq {
						after = cps[j].Seq
						break
					}
				}
				return &BrokenError{Seq: r.Seq, Checkpoint: c.Name(), Kind: "rewritten", Reason: fmt.Sprintf(
					"checkpoint %d (%s) recorded row %d hashing %x; the table's row %d hashes %x and its columns agree, so a row after seq %d, up to seq %d, was rewritten and every later row re-chained (or the database was restored to an earlier point and has written new rows since)",
					c.N, c.At.Format("2006-01-02T15:04:05Z07:00"), r.Seq, c.Head, r.Seq, r.Hash, after, r.Seq)}
			}
		}
		return nil
	})
	if err != nil {
		return rep, err
	}
	rep.Checkpoints = len(cps)
	if len(cps) > 0 {
		rep.AnchoredSeq = cps[len(cps)-1].Seq
	}
	if i < len(cps) {
		newest := cps[len(cps)-1]
		return rep, &BrokenError{Seq: rep.HeadSeq, Checkpoint: cps[i].Name(), Kind: "rollback", LostFrom: rep.HeadSeq + 1, LostTo: newest.Seq,
			Reason: fmt.Sprintf("the table ends at seq %d but checkpoint %d recorded seq %d (and checkpoint %d seq %d): seqs %d to %d are lost (rows deleted from the tail, or the database restored to an earlier point)",
				rep.HeadSeq, cps[i].N, cps[i].Seq, newest.N, newest.Seq, rep.HeadSeq+1, newest.Seq)}
	}
	return rep, nil
}
