package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
)

// DBReports keeps the reports in PostgreSQL (table relay_reports).
type DBReports struct {
	Pool *pgxpool.Pool
}

var _ Reports = DBReports{}

// Put records r (the database stamps its time).
func (d DBReports) Put(ctx context.Context, r Report) error {
	heard := make(map[string]int64, len(r.Heard))
	for id, ago := range r.Heard {
		heard[id] = ago.Milliseconds()
	}
	b, err := json.Marshal(heard)
	if err != nil {
		return fmt.Errorf("encode what %s hears: %w", r.Replica, err)
	}
	shards := make([]int32, len(r.Shards))
	for i, s := range r.Shards {
		shards[i] = int32(s)
	}
	if err := db.New(d.Pool).RelayReportPut(ctx, db.RelayReportPutParams{Replica: r.Replica, Heard: b, Shards: shards}); err != nil {
		return fmt.Errorf("record what %s hears: %w", r.Replica, err)
	}
	return nil
}

// Fresh lists the reports made within the last within, newest first.
func (d DBReports) Fresh(ctx context.Context, within time.Duration) ([]Report, error) {
	rows, err := db.New(d.Pool).RelayReportListFresh(ctx, within.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("read what the replicas hear: %w", err)
	}
	out := make([]Report, 0, len(rows))
	for _, row := range rows {
		var heard map[string]int64
		if err := json.Unmarshal(row.Heard, &heard); err != nil {
			return nil, fmt.Errorf("decode what %s hears: %w", row.Replica, err)
		}
		r := Report{Replica: row.Replica, Heard: make(map[string]time.Duration, len(heard)), Age: time.Duration(max(row.AgeMs, 0)) * time.Millisecond}
		for id, ms := range heard {
			r.Heard[id] = time.Duration(ms) * time.Millisecond
		}
		for _, s := range row.Shards {
			r.Shards = append(r.Shards, int(s))
		}
		out = append(out, r)
	}
	return out, nil
}

// Forget removes replica's report, and any not renewed for an hour.
func (d DBReports) Forget(ctx context.Context, replica string) error {
	if err := db.New(d.Pool).RelayReportForget(ctx, replica); err != nil {
		return fmt.Errorf("forget what %s heard: %w", replica, err)
	}
	return nil
}
