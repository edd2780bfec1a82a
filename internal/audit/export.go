package audit

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/musterhq/muster/db"
)

// An export is JSON Lines (doc.go: Export): a header line, then the rows of
// one contiguous seq range oldest first, then the checkpoints that cover
// them, each line an object with a "type". Row columns are carried so that
// each row's hash can be recomputed offline: before and after as
// PostgreSQL's own jsonb text, in a JSON string, never re-encoded.

type exportLine struct {
	Type string `json:"type"` // header, row, checkpoint

	// header
	V        int        `json:"v,omitempty"`
	Since    *time.Time `json:"since,omitempty"`
	Until    *time.Time `json:"until,omitempty"`
	FirstSeq int64      `json:"first_seq,omitempty"`
	LastSeq  int64      `json:"last_seq,omitempty"`

	// row
	Row *exportRow `json:"row,omitempty"`

	// checkpoint: the checkpoint file, byte for byte, as a string.
	Name string `json:"name,omitempty"`
	File string `json:"file,omitempty"`
}

type exportRow struct {
	Seq        int64     `json:"seq"`
	At         time.Time `json:"at"`
	ActorKind  string    `json:"actor_kind"`
	Actor      string    `json:"actor"`
	Action     string    `json:"action"`
	TargetKind string    `json:"target_kind"`
	Target     string    `json:"target"`
	Outcome    string    `json:"outcome"`
	Reason     string    `json:"reason"`
	Before     *string   `json:"before"`
	After      *string   `json:"after"`
	PrevHash   string    `json:"prev_hash"`
	Hash       string    `json:"hash"`
}

// ExportReport says what an export holds, or what verifying one found.
type ExportReport struct {
	FirstSeq, LastSeq int64 // the rows exported (0, 0: none)
	Checkpoints       int
	// AnchoredSeq is the seq of the newest checkpoint in the export;
	// rows after it (Unanchored) were not yet covered by a checkpoint
	// when exported.
	AnchoredSeq int64
	Unanchored  int64
}

// Export writes the rows from the first at or after since to the last
// before until as JSON Lines to w, with the checkpoints of sink that cover
// them: those from the first at or after the range's first seq to the
// first at or after its last seq. The rows are extended to that
// checkpoint's seq, so that the newest exported row is anchored too.
func Export(ctx context.Context, q *db.Queries, cps []Checkpoint, sink Sink, since, until time.Time, w io.Writer) (ExportReport, error) {
	var rep ExportReport
	r, err := q.AuditSeqRange(ctx, db.AuditSeqRangeParams{Since: since, Until: until})
	if err != nil {
		return rep, fmt.Errorf("export audit: find the range: %w", err)
	}
	first, last := r.FirstSeq, r.LastSeq
	var cover []Checkpoint
	if first > 0 && last >= first {
		for _, c := range cps {
			if c.Seq < first {
				continue
			}
			cover = append(cover, c)
			if c.Seq >= last {
				last = c.Seq
				break
			}
		}
	} else {
		first, last = 0, 0
	}
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	since, until = since.UTC(), until.UTC()
	if err := enc.Encode(exportLine{Type: "header", V: 1, Since: &since, Until: &until, FirstSeq: first, LastSeq: last}); err != nil {
		return rep, fmt.Errorf("export audit: %w", err)
	}
	if first > 0 {
		for after := first - 1; after < last; {
			page, err := q.AuditPage(ctx, db.AuditPageParams{AfterSeq: after, Lim: int32(min(1000, last-after))})
			if err != nil {
				return rep, fmt.Errorf("export audit rows after seq %d: %w", after, err)
			}
			if len(page) == 0 {
				return rep, fmt.Errorf("export audit: rows after seq %d are missing (up to %d expected): verify the chain", after, last)
			}
			for _, dr := range page {
				row := rowFrom(dr)
				if err := enc.Encode(exportLine{Type: "row", Row: toExportRow(row)}); err != nil {
					return rep, fmt.Errorf("export audit: %w", err)
				}
				after = row.Seq
			}
		}
	}
	for _, c := range cover {
		data, err := sink.Get(ctx, c.Name())
		if err != nil {
			return rep, fmt.Errorf("export audit: %w", err)
		}
		if err := enc.Encode(exportLine{Type: "checkpoint", Name: c.Name(), File: string(data)}); err != nil {
			return rep, fmt.Errorf("export audit: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return rep, fmt.Errorf("export audit: %w", err)
	}
	rep = ExportReport{FirstSeq: first, LastSeq: last, Checkpoints: len(cover)}
	if len(cover) > 0 {
		rep.AnchoredSeq = cover[len(cover)-1].Seq
	}
	if first > 0 {
		rep.Unanchored = last - max(rep.AnchoredSeq, first-1)
	}
	return rep, nil
}

func toExportRow(r Row) *exportRow {
	opt := func(b []byte) *string {
		if b == nil {
			return nil
		}
		s := string(b)
		return &s
	}
	return &exportRow{Seq: r.Seq, At: r.At.UTC(), ActorKind: r.ActorKind, Actor: r.Actor, Action: r.Action,
		TargetKind: r.TargetKind, Target: r.Target, Outcome: r.Outcome, Reason: r.Reason,
		Before: opt(r.Before), After: opt(r.After), PrevHash: hex.EncodeToString(r.PrevHash), Hash: hex.EncodeToString(r.Hash)}
}

// maxExportLine bounds one line of an export: a row's before and after
// are bounded by what muster writes, far below this.
const maxExportLine = 16 << 20

// VerifyExport checks an export offline, without a database: every row's
// hash recomputed from its columns, the rows contiguous and linked, every
// checkpoint's signature (with keys) and its link to the one before, and
// every row a checkpoint names hashing to the head it recorded. The first
// failure is a *BrokenError naming the row and checkpoint; other malformed
// input is an error naming the line.
func VerifyExport(r io.Reader, keys Keys) (ExportReport, error) {
	var (
		rep     ExportReport
		header  *exportLine
		prev    []byte
		lastSeq int64
		hashes  = map[int64][]byte{}
		cps     []Checkpoint
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxExportLine)
	for n := 1; sc.Scan(); n++ {
		var l exportLine
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return rep, fmt.Errorf("export line %d: %w", n, err)
		}
		switch {
		case l.Type == "header" && n == 1:
			if l.V != 1 || l.FirstSeq < 0 || l.LastSeq < l.FirstSeq || (l.FirstSeq == 0) != (l.LastSeq == 0) {
				return rep, fmt.Errorf("export line 1: header version %d, seqs %d to %d", l.V, l.FirstSeq, l.LastSeq)
			}
			header, lastSeq = &l, max(l.FirstSeq-1, 0)
		case header == nil:
			return rep, fmt.Errorf("export line %d: the first line must be the header", n)
		case l.Type == "row" && l.Row != nil && len(cps) == 0:
			row, err := fromExportRow(*l.Row)
			if err != nil {
				return rep, fmt.Errorf("export line %d: %w", n, err)
			}
			if prev == nil {
				// The range's first row links to what came before it,
				// which the export does not hold (but the checkpoints
				// after it cover it); the chain's very first row links
				// to nothing.
				prev = row.PrevHash
				if row.Seq == 1 {
					prev = genesis
				}
			}
			if err := checkRow(row, lastSeq, prev); err != nil {
				return rep, err
			}
			prev, lastSeq = row.Hash, row.Seq
			hashes[row.Seq] = row.Hash
		case l.Type == "checkpoint":
			c, err := DecodeCheckpoint([]byte(l.File), keys)
			if err != nil {
				return rep, &BrokenError{Checkpoint: l.Name, Kind: "signature", Reason: err.Error()}
			}
			if len(cps) > 0 {
				if err := checkLink(l.Name, &cps[len(cps)-1], c); err != nil {
					return rep, err
				}
			} else if l.Name != c.Name() {
				return rep, &BrokenError{Seq: c.Seq, Checkpoint: l.Name, Kind: "checkpoint-chain", Reason: fmt.Sprintf("the line holds checkpoint %d", c.N)}
			}
			cps = append(cps, c)
		default:
			return rep, fmt.Errorf("export line %d: unexpected %q line", n, l.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return rep, fmt.Errorf("read export: %w", err)
	}
	if header == nil {
		return rep, errors.New("export is empty: no header")
	}
	if lastSeq != header.LastSeq {
		return rep, &BrokenError{Seq: lastSeq, Kind: "rollback", LostFrom: lastSeq + 1, LostTo: header.LastSeq,
			Reason: fmt.Sprintf("the export's header promises rows %d to %d, but they end at %d", header.FirstSeq, header.LastSeq, lastSeq)}
	}
	for _, c := range cps {
		h, ok := hashes[c.Seq]
		switch {
		case !ok && c.Seq > lastSeq:
			return rep, &BrokenError{Seq: lastSeq, Checkpoint: c.Name(), Kind: "rollback", LostFrom: lastSeq + 1, LostTo: c.Seq,
				Reason: fmt.Sprintf("checkpoint %d recorded seq %d, past the export's last row %d", c.N, c.Seq, lastSeq)}
		case !ok:
			return rep, &BrokenError{Seq: c.Seq, Checkpoint: c.Name(), Kind: "checkpoint-chain", Reason: fmt.Sprintf("checkpoint %d names seq %d, before the export's first row", c.N, c.Seq)}
		case !bytes.Equal(h, c.Head):
			return rep, &BrokenError{Seq: c.Seq, Checkpoint: c.Name(), Kind: "rewritten", Reason: fmt.Sprintf("checkpoint %d recorded row %d hashing %x; the export's row hashes %x", c.N, c.Seq, c.Head, h)}
		}
	}
	rep = ExportReport{FirstSeq: header.FirstSeq, LastSeq: header.LastSeq, Checkpoints: len(cps)}
	if len(cps) > 0 {
		rep.AnchoredSeq = cps[len(cps)-1].Seq
	}
	if header.FirstSeq > 0 {
		rep.Unanchored = header.LastSeq - max(rep.AnchoredSeq, header.FirstSeq-1)
	}
	return rep, nil
}

func fromExportRow(e exportRow) (Row, error) {
	r := Row{Seq: e.Seq, At: e.At, ActorKind: e.ActorKind, Actor: e.Actor, Action: e.Action, TargetKind: e.TargetKind,
		Target: e.Target, Outcome: e.Outcome, Reason: e.Reason}
	if e.Before != nil {
		r.Before = []byte(*e.Before)
	}
	if e.After != nil {
		r.After = []byte(*e.After)
	}
	var err error
	if r.PrevHash, err = hex.DecodeString(e.PrevHash); err != nil || len(r.PrevHash) != 32 {
		return r, fmt.Errorf("row %d: prev_hash %q is not a SHA-256 in hex", e.Seq, e.PrevHash)
	}
	if r.Hash, err = hex.DecodeString(e.Hash); err != nil || len(r.Hash) != 32 {
		return r, fmt.Errorf("row %d: hash %q is not a SHA-256 in hex", e.Seq, e.Hash)
	}
	return r, nil
}
