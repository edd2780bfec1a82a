package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/user"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/musterhq/muster/db"
	"github.com/musterhq/muster/internal/cli"
)

const migrateUsage = `usage: muster migrate up|down|version|status [--data DIR]
       muster migrate force VERSION [--data DIR]`

// cmdMigrate runs `muster migrate`. It reads the environment and connects
// exactly as serve does (DATABASE_URL with target_session_attrs=read-write,
// MUSTER_DB_IAM's tokens and its verify-full rule), so a Job or an init
// container running it reaches the database the replicas use, the way
// they do.
func cmdMigrate(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	if len(args) == 0 {
		fmt.Fprintln(stderr, migrateUsage)
		return cli.ErrUsage
	}
	verb, rest := args[0], args[1:]
	var force uint
	switch verb {
	case "up", "down", "version", "status":
	case "force":
		if len(rest) == 0 {
			fmt.Fprintln(stderr, "muster migrate force: the VERSION to record is required\n"+migrateUsage)
			return cli.ErrUsage
		}
		n, perr := strconv.ParseUint(rest[0], 10, 32)
		if perr != nil {
			fmt.Fprintf(stderr, "muster migrate force: VERSION %q is not a migration number\n", rest[0])
			return cli.ErrUsage
		}
		force, rest = uint(n), rest[1:]
	default:
		fmt.Fprintf(stderr, "muster migrate: unknown verb %q (want up, down, version, status or force)\n", verb)
		return cli.ErrUsage
	}
	cfg := Config{}
	fs := cli.NewFlags("migrate "+verb, stderr)
	cli.DataFlag(fs, &cfg.DataDir)
	if err := cli.Parse(fs, rest); err != nil {
		return err
	}
	if err := loadEnv(&cfg); err != nil {
		return err
	}
	if err := cfg.validateIAM(); err != nil {
		return err
	}
	log := cli.QuietLogger(stderr)
	dbURL, stop, err := openDatabase(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stop()) }()
	target, err := newDBTarget(ctx, cfg, dbURL)
	if err != nil {
		return err
	}
	target.logRoots(log)
	mg, err := target.migrator()
	if err != nil {
		return err
	}
	defer mg.Close()
	switch verb {
	case "up":
		err = mg.Up()
		if mg.Repaired != 0 {
			log.Warn("the schema was dirty: a migration was stopped half-way; it runs in one transaction, so nothing of it stayed, and it was run again",
				"migration", mg.Repaired)
		}
		if ahead := (*db.AheadError)(nil); errors.As(err, &ahead) {
			// Nothing to apply: a newer release migrated further.
			fmt.Fprintf(stdout, "nothing applied: a newer release migrated the database past this release's last migration (%d)\n", ahead.Known)
			err = nil
		}
	case "down":
		err = mg.Down()
	case "force":
		was, wasDirty, ferr := mg.Force(force)
		if ferr != nil {
			return ferr
		}
		// The record of who changed the schema's version, from what: the
		// database keeps no history of schema_migrations.
		log.Warn("muster migrate force: the schema's version was set by hand, clean, without running any migration",
			"from", was, "from_dirty", wasDirty, "to", force, "database", describeDB(target.url), "by", osUser())
	}
	if err != nil {
		return err
	}
	v, dirty, err := mg.Version()
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "schema version %d", v)
	if dirty {
		fmt.Fprintf(stdout, " (dirty: migration %d stopped half-way; `muster serve` runs it again if it is transactional, else repair it by hand and run `muster migrate force VERSION`)", v)
	}
	fmt.Fprintln(stdout)
	if verb == "status" {
		last, err := db.LatestMigration()
		if err != nil {
			return err
		}
		switch {
		case v > last:
			fmt.Fprintf(stdout, "this release's last migration is %d: a newer release migrated the database\n", last)
		case v < last:
			fmt.Fprintf(stdout, "this release's last migration is %d: %d to apply (`muster migrate up`, or the next start)\n", last, last-v)
		default:
			fmt.Fprintf(stdout, "this release's last migration is %d: up to date\n", last)
		}
	}
	return nil
}

// describeDB names the database of a connection string for a log line:
// its user, host and database, never its password.
func describeDB(dbURL string) string {
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return "(unparsable DATABASE_URL)"
	}
	u := url.URL{Scheme: "postgres", User: url.User(cc.User), Host: cc.Host, Path: "/" + cc.Database}
	if cc.Port != 0 {
		u.Host = fmt.Sprintf("%s:%d", cc.Host, cc.Port)
	}
	return u.String()
}

// osUser is who ran the command, as the operating system knows them.
func osUser() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return cmpOr(os.Getenv("USER"), "unknown")
}
