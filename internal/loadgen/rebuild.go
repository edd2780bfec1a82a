package loadgen

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/cli"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/seal"
)

// loadgenRebuild measures what a restart costs: a fresh evaluator rebuilding
// its state from the registry and the retained windows. A database with no
// instance yet is seeded first, as `loadgen seed` would with the same
// flags (60,000 live and 1,000,000 ended instances by default), so one
// command gives the figure; one already seeded is rebuilt from as it is.
func loadgenRebuild(ctx context.Context, env Env, args []string, stdout, stderr io.Writer) (err error) {
	var dir, cpuProfile string
	var o seedOptions
	fs := cli.NewFlags("loadgen rebuild", stderr)
	cli.DataFlag(fs, &dir)
	o.flags(fs, 1_000_000)
	fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the rebuild to this file")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if err := o.validate(); err != nil {
		return err
	}
	var seedFlags []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name != "data" && f.Name != "cpuprofile" {
			seedFlags = append(seedFlags, "--"+f.Name)
		}
	})
	pool, region, closeDB, err := env.OpenDB(ctx, dir, stderr)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, closeDB()) }()
	// A database seeded by an earlier build is brought up to this one's
	// schema first, as muster's start would (else the rebuild retries a
	// query on a column the table lacks, for ever).
	if err := db.Migrate(pool.Config().ConnString()); err != nil {
		return err
	}
	// The registry checks the instances' seals as muster's does, so the
	// rebuild's time includes them.
	var key seal.Signer
	if env.SealKey != nil {
		if key, err = env.SealKey(dir); err != nil {
			return err
		}
	}
	live, ended, err := instanceCensus(ctx, pool)
	if err != nil {
		return err
	}
	switch {
	case live+ended == 0:
		if err := seed(ctx, pool, region, key, o, stdout); err != nil {
			return err
		}
	case len(seedFlags) > 0:
		return fmt.Errorf("loadgen rebuild: the database already holds %d live and %d ended instances, so %v would not apply: give a fresh --data folder (or drop the flags to rebuild from what is there)",
			live, ended, seedFlags)
	}

	reg, err := registry.New(registry.Config{Pool: pool, Region: region, Sealer: key})
	if err != nil {
		return err
	}
	ev, err := evaluator.New(evaluator.Config{Registry: reg, Pool: pool, FlushEvery: time.Minute, Logger: cli.QuietLogger(stderr)})
	if err != nil {
		return err
	}
	var before, after memStats
	before.read()
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	cpuBefore := processCPU()
	start := time.Now()
	if err := ev.Start(ctx); err != nil {
		return err
	}
	defer ev.Stop()
	for !ev.Ready() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	took := time.Since(start)
	cpu := processCPU() - cpuBefore
	after.read()
	stats := ev.Stats()
	if live, ended, err = instanceCensus(ctx, pool); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rebuild: %d services, %d instances, %d admissions restored (in %s), %d windows replayed, %d quarantines restored (in %s) in %s (heap +%.1f MiB, %.0f B per instance)\n",
		stats.Services, stats.Instances, stats.AdmissionsRestored, stats.AdmissionsTook.Round(time.Millisecond/10),
		stats.WindowsReplayed, stats.QuarantinesRestored, stats.QuarantinesTook.Round(time.Millisecond/10),
		took.Round(time.Millisecond), float64(after.heap-before.heap)/(1<<20), float64(after.heap-before.heap)/float64(max(stats.Instances, 1)))
	fmt.Fprintf(stdout, "rebuild at %d live and %d ended instances: %s; it read %d instance rows (in %s); CPU %.1f s user+sys in this process (PostgreSQL's not counted)\n",
		live, ended, took.Round(time.Millisecond), stats.InstanceRowsRead, stats.RegistryTook.Round(time.Millisecond), cpu.Seconds())
	return nil
}

// instanceCensus counts the live and the ended instance rows.
func instanceCensus(ctx context.Context, pool *pgxpool.Pool) (live, ended int64, err error) {
	rows, err := db.New(pool).InstanceCountByState(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("count instances: %w", err)
	}
	for _, r := range rows {
		if r.State == registry.StateActive {
			live += r.Rows
		} else {
			ended += r.Rows
		}
	}
	return live, ended, nil
}

// endedChunk is how many ended rows seedEnded signs and copies at once,
// so a million never sit in memory together.
const endedChunk = 50_000

// seedEnded writes n ended instances of services, as the deploys, scale-ins
// and lease expiries of the days before now leave them: perHour ended in
// each hour back from now (the newest perHour within the last hour, where
// the rebuild keeps expired ones for the guard), four in ten deregistered,
// three replaced by a new registration of their endpoint, three expired.
// With key set each is sealed as muster seals what it ends (its identity
// and its end); the record of each end in the audit chain (which only the
// check of rows that read active consults, by id) is not written.
func seedEnded(ctx context.Context, pool *pgxpool.Pool, region string, key seal.Signer, services []string, now time.Time, n, perHour int) error {
	every := (time.Hour / time.Duration(perHour)).Truncate(time.Microsecond) // as stored: the seals cover it
	states := [10]string{registry.StateExpired, registry.StateReplaced, registry.StateDeregistered, registry.StateExpired,
		registry.StateReplaced, registry.StateDeregistered, registry.StateExpired, registry.StateReplaced,
		registry.StateDeregistered, registry.StateDeregistered}
	for done := 0; done < n; {
		rows := make([]db.InstancesCopyParams, min(endedChunk, n-done))
		for j := range rows {
			k := done + j
			endedAt := now.Add(-time.Duration(k+1) * every)
			created := endedAt.Add(-24 * time.Hour)
			lease := endedAt
			rows[j] = db.InstancesCopyParams{
				ID: uuid.Must(uuid.NewV7()), Service: services[k%len(services)],
				Address: fmt.Sprintf("10.%d.%d.%d", 128+(k>>16&127), k>>8&255, k&255), Port: 8080,
				Zone: fmt.Sprintf("az%d", (k/len(services))%3+1), Region: region, Source: "loadgen", State: states[k%len(states)],
				LeaseExpiresAt: &lease, RegisteredBy: "tool:loadgen", CreatedAt: created, UpdatedAt: endedAt, EndedAt: &endedAt,
			}
		}
		if key != nil {
			if err := registry.SealCopy(ctx, key, rows); err != nil {
				return err
			}
		}
		if _, err := db.New(pool).InstancesCopy(ctx, rows); err != nil {
			return fmt.Errorf("seed ended instances: %w", err)
		}
		done += len(rows)
	}
	return nil
}
