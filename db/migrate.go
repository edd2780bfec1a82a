package db

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strconv"
	"strings"

	"github.com/golang-migrate/migrate/v4"
	migratepgx "github.com/golang-migrate/migrate/v4/database/pgx/v5" // also the pgx5:// driver
	"github.com/golang-migrate/migrate/v4/source/iofs"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/musterhq/muster/migrations"
)

// Migrator applies the embedded migrations to one database.
type Migrator struct {
	m *migrate.Migrate
}

// NewMigrator prepares golang-migrate for the database at databaseURL
// (a postgres:// URL or key=value DSN as pgx accepts it).
func NewMigrator(databaseURL string) (*Migrator, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	u, err := migrateURL(databaseURL)
	if err != nil {
		return nil, err
	}
	m, err := migrate.NewWithSourceInstance("iofs", src, u)
	if err != nil {
		return nil, fmt.Errorf("open migrations target: %w", err)
	}
	return &Migrator{m: m}, nil
}

// NewMigratorIAM is NewMigrator for a database that authenticates with
// IAM tokens: each of the migrator's connections presents the current
// token of iam as its password.
func NewMigratorIAM(databaseURL string, iam *IAMTokens) (*Migrator, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	cc, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cc.OnPgError = closeOnReadOnly(cc.OnPgError)
	sqlDB := stdlib.OpenDB(*cc, stdlib.OptionBeforeConnect(iam.beforeConnect))
	drv, err := migratepgx.WithInstance(sqlDB, &migratepgx.Config{})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("open migrations target: %w", err)
	}
	m, err := migrate.NewWithInstance("iofs", src, "pgx5", drv)
	if err != nil {
		drv.Close()
		return nil, fmt.Errorf("open migrations target: %w", err)
	}
	return &Migrator{m: m}, nil
}

// ErrSchemaAhead is wrapped by Up's error when the database was migrated
// by a newer release, past the last migration this one embeds.
var ErrSchemaAhead = errors.New("the database's schema is newer than this release's migrations")

// AheadError is Up's error for a database whose schema is at Database, a
// version above Known, the last this release embeds, and clean (its last
// migration completed). It matches ErrSchemaAhead.
//
// During a rolling upgrade the newer release migrates first, and a
// replica of the older one that restarts meets its schema. Migrations
// are additive by policy (docs/replicas.md, "Rolling upgrade": expand in
// one release, contract in a later one), so the older release works on
// it, and its caller may go on with a warning; golang-migrate alone
// refuses ("no migration found for version N"), and a rolling restart
// would then lose every replica not yet upgraded.
type AheadError struct {
	Database, Known uint
}

func (e *AheadError) Error() string {
	return fmt.Sprintf("migrate up: the database's schema is at version %d, newer than this release's last migration %d (a newer release migrated it)", e.Database, e.Known)
}

// Is makes an AheadError match ErrSchemaAhead.
func (e *AheadError) Is(target error) bool { return target == ErrSchemaAhead }

// Up applies every pending migration. No pending migration is not an
// error. A database a newer release migrated past this one's migrations
// is left as it is, with an *AheadError when its schema is clean; a dirty
// one (a migration that failed half-way, whichever release ran it) is
// refused with golang-migrate's ErrDirty: nobody knows what it holds.
func (mg *Migrator) Up() error {
	err := mg.m.Up()
	if err == nil || errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return fmt.Errorf("migrate up: the schema is dirty at version %d (a migration failed half-way): repair it by hand and force the version (golang-migrate's migrate force), then start again: %w", dirty.Version, err)
	}
	// golang-migrate does not find the database's version among this
	// release's migrations: ahead of them, or unknown to it.
	if errors.Is(err, fs.ErrNotExist) {
		known, kerr := latestMigration()
		v, isDirty, verr := mg.Version()
		if kerr == nil && verr == nil && !isDirty && v > known {
			return &AheadError{Database: v, Known: known}
		}
	}
	return fmt.Errorf("migrate up: %w", err)
}

// latestMigration is the version of the last migration embedded.
func latestMigration() (uint, error) {
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		return 0, err
	}
	var last uint
	for _, f := range ups {
		n, err := strconv.ParseUint(f[:max(strings.IndexByte(f, '_'), 0)], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("migration %s: %w", f, err)
		}
		last = max(last, uint(n))
	}
	return last, nil
}

// Down rolls back one migration.
func (mg *Migrator) Down() error {
	if err := mg.m.Steps(-1); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate down: %w", err)
	}
	return nil
}

// Version reports the applied version and whether the last migration failed
// half-way (dirty). Version 0 means no migration has been applied.
func (mg *Migrator) Version() (version uint, dirty bool, err error) {
	v, d, err := mg.m.Version()
	if errors.Is(err, migrate.ErrNilVersion) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("migrate version: %w", err)
	}
	return v, d, nil
}

// Close releases the migrator's connections.
func (mg *Migrator) Close() error {
	srcErr, dbErr := mg.m.Close()
	return errors.Join(srcErr, dbErr)
}

// Migrate is the common case: apply every pending migration and close.
func Migrate(databaseURL string) error {
	mg, err := NewMigrator(databaseURL)
	if err != nil {
		return err
	}
	defer mg.Close()
	return mg.Up()
}

// MigrateIAM is Migrate for a database that authenticates with IAM
// tokens (NewMigratorIAM); with iam nil it is Migrate.
func MigrateIAM(databaseURL string, iam *IAMTokens) error {
	if iam == nil {
		return Migrate(databaseURL)
	}
	mg, err := NewMigratorIAM(databaseURL, iam)
	if err != nil {
		return err
	}
	defer mg.Close()
	return mg.Up()
}

// migrateURL turns a pgx connection string into the pgx5:// URL that
// golang-migrate's pgx driver expects.
func migrateURL(databaseURL string) (string, error) {
	switch {
	case strings.HasPrefix(databaseURL, "postgres://"):
		return "pgx5://" + strings.TrimPrefix(databaseURL, "postgres://"), nil
	case strings.HasPrefix(databaseURL, "postgresql://"):
		return "pgx5://" + strings.TrimPrefix(databaseURL, "postgresql://"), nil
	case strings.HasPrefix(databaseURL, "pgx5://"):
		return databaseURL, nil
	}
	u, err := url.Parse(databaseURL)
	if err == nil && u.Scheme != "" {
		return "", fmt.Errorf("database url: unsupported scheme %q (want postgres://)", u.Scheme)
	}
	return "", fmt.Errorf("database url: want a postgres:// URL")
}
