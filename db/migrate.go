package db

import (
	"errors"
	"fmt"
	"net/url"
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

// Up applies every pending migration. No pending migration is not an error.
func (mg *Migrator) Up() error {
	if err := mg.m.Up(); err != nil && !errors.Is(err, migrate.ErrNoChange) {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
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
