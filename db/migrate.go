package db

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"regexp"
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
	m   *migrate.Migrate
	url string
	iam *IAMTokens // nil: the URL's own password
	// roots verify the server where the URL names no sslrootcert (nil:
	// the URL's own settings alone).
	roots *x509.CertPool

	// Repaired is the version of the dirty migration the last Up ran
	// again (0: none): the caller says so in its log.
	Repaired uint
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
	return &Migrator{m: m, url: databaseURL}, nil
}

// NewMigratorIAM is NewMigrator for a database that authenticates with
// IAM tokens: each of the migrator's connections presents the current
// token of iam as its password.
func NewMigratorIAM(databaseURL string, iam *IAMTokens) (*Migrator, error) {
	return newMigratorPgx(databaseURL, iam, nil)
}

// newMigratorPgx opens golang-migrate on a pgx configuration of its own
// rather than a URL golang-migrate parses, so each new connection can
// present iam's token (if set) and verify the server against roots (if
// set: see SetRootCAs).
func newMigratorPgx(databaseURL string, iam *IAMTokens, roots *x509.CertPool) (*Migrator, error) {
	src, err := iofs.New(migrations.FS, ".")
	if err != nil {
		return nil, fmt.Errorf("open embedded migrations: %w", err)
	}
	cc, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	cc.OnPgError = closeOnReadOnly(cc.OnPgError)
	SetRootCAs(&cc.Config, roots)
	var opts []stdlib.OptionOpenDB
	if iam != nil {
		opts = append(opts, stdlib.OptionBeforeConnect(iam.beforeConnect))
	}
	sqlDB := stdlib.OpenDB(*cc, opts...)
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
	return &Migrator{m: m, url: databaseURL, iam: iam, roots: roots}, nil
}

// OpenMigrator is NewMigrator, or NewMigratorIAM when iam is set.
func OpenMigrator(databaseURL string, iam *IAMTokens) (*Migrator, error) {
	return OpenMigratorRoots(databaseURL, iam, nil)
}

// OpenMigratorRoots is OpenMigrator whose connections verify the server
// against roots where the URL names no sslrootcert (SetRootCAs); roots
// nil changes nothing.
func OpenMigratorRoots(databaseURL string, iam *IAMTokens, roots *x509.CertPool) (*Migrator, error) {
	if iam == nil && roots == nil {
		return NewMigrator(databaseURL)
	}
	return newMigratorPgx(databaseURL, iam, roots)
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
// is left as it is, with an *AheadError when its schema is clean.
//
// A dirty schema (a migration that stopped half-way: its process was
// killed, or it failed) at a version this release embeds, whose up
// migration runs in one transaction (Transactional), is repaired: the
// failed migration's transaction was rolled back whole, so the schema is
// the one before it, and Up forces the version back to the previous
// migration and runs it again (Repaired says so). Every other dirty
// schema is refused with golang-migrate's ErrDirty and the command that
// clears it: nobody knows what it holds.
//
// Several replicas may call Up at once: a session-level advisory lock of
// muster's own, held from the first look at the version to the last
// migration, makes them take turns, so one migrates (or repairs) and the
// others find nothing to do. A process killed while holding it releases
// it with its connection.
func (mg *Migrator) Up() (err error) {
	ctx := context.Background()
	unlock, err := mg.lock(ctx)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	mg.Repaired = 0
	if v, dirty, verr := mg.Version(); verr == nil && dirty {
		if err := mg.repair(v); err != nil {
			return err
		}
		mg.Repaired = v
	}
	err = mg.m.Up()
	if err == nil || errors.Is(err, migrate.ErrNoChange) {
		return nil
	}
	var dirty migrate.ErrDirty
	if errors.As(err, &dirty) {
		return fmt.Errorf("migrate up: %w", &DirtyError{Version: uint(dirty.Version)})
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

// ErrSchemaBehind is wrapped by Check's error for a database whose
// schema lacks some of this release's migrations.
var ErrSchemaBehind = errors.New("the database's schema is older than this release's migrations")

// BehindError is Check's error for a clean schema at Database, below
// Known, the last migration this release embeds. It matches
// ErrSchemaBehind.
type BehindError struct {
	Database, Known uint
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("the database's schema is at version %d, behind this release's last migration %d: run `muster migrate up` (the chart's migrations Job does) and start again", e.Database, e.Known)
}

// Is makes a BehindError match ErrSchemaBehind.
func (e *BehindError) Is(target error) bool { return target == ErrSchemaBehind }

// Check looks at the schema and changes nothing: nil when it is clean at
// this release's last migration, an *AheadError when it is clean past it
// (a newer release migrated it), a *BehindError when it is clean before
// it, and a *DirtyError when a migration stopped half-way. It is for a
// process that must not migrate (a migrations Job runs them) but must not
// serve on a schema it does not fit: it takes no lock, as it writes
// nothing and a migration in progress shows as dirty.
func (mg *Migrator) Check() error {
	v, dirty, err := mg.Version()
	if err != nil {
		return err
	}
	if dirty {
		return &DirtyError{Version: v}
	}
	known, err := latestMigration()
	if err != nil {
		return err
	}
	switch {
	case v > known:
		return &AheadError{Database: v, Known: known}
	case v < known:
		return &BehindError{Database: v, Known: known}
	}
	return nil
}

// repair makes a schema dirty at version v clean at the migration before
// v, when v's up migration is transactional; else a *DirtyError.
func (mg *Migrator) repair(v uint) error {
	up, err := upMigration(v)
	if err != nil || !Transactional(up) {
		return fmt.Errorf("migrate up: %w", &DirtyError{Version: v})
	}
	prev, err := previousMigration(v)
	if err != nil {
		return err
	}
	if err := mg.m.Force(forceArg(prev)); err != nil {
		return fmt.Errorf("migrate up: force version %d to run migration %d again: %w", prev, v, err)
	}
	return nil
}

// DirtyError is the error for a schema left dirty at Version that muster
// does not repair by itself: a migration it does not know (a newer
// release's), or one that does not run in one transaction, so its
// half-way state is unknown.
type DirtyError struct{ Version uint }

func (e *DirtyError) Error() string {
	return fmt.Sprintf("the schema is dirty at version %d: migration %d stopped half-way and muster cannot tell what it left. "+
		"Compare the schema with migrations/%06d_*.up.sql, finish or undo it by hand, then run `muster migrate force VERSION` "+
		"(%d if it is complete, else the version before it) and start again", e.Version, e.Version, e.Version, e.Version)
}

// Is makes a DirtyError match golang-migrate's ErrDirty.
func (e *DirtyError) Is(target error) bool {
	_, ok := target.(migrate.ErrDirty)
	return ok
}

// migrateLockID is the key of muster's own advisory lock around Up (a
// different key from golang-migrate's, which Up takes inside it).
const migrateLockID = 0x6d75737465720001 // "muster" and 1

// lock takes muster's migration lock on a connection of its own, waiting
// for a replica that holds it.
func (mg *Migrator) lock(ctx context.Context) (unlock func() error, err error) {
	cc, err := pgx.ParseConfig(mg.url)
	if err != nil {
		return nil, errors.New("migrate: parse database url") // pgx's error may quote the URL
	}
	SetRootCAs(&cc.Config, mg.roots)
	if mg.iam != nil {
		if cc.Password, err = mg.iam.Token(ctx); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("migrate: connect for the migration lock: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", int64(migrateLockID)); err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("migrate: take the migration lock: %w", err)
	}
	// Closing the session releases the lock.
	return func() error { return conn.Close(context.Background()) }, nil
}

// Force sets the schema's version to v, clean, without running anything:
// for an operator who has repaired a dirty schema by hand. v must be one
// of the embedded migrations, or 0 (no migration applied). It returns the
// version and dirty flag it replaced.
func (mg *Migrator) Force(v uint) (was uint, wasDirty bool, err error) {
	if v != 0 {
		if _, err := upMigration(v); err != nil {
			known, _ := latestMigration()
			return 0, false, fmt.Errorf("migrate force: %d is not one of this release's migrations (1 to %d, see migrations/): %w", v, known, ErrUnknownVersion)
		}
	}
	ctx := context.Background()
	unlock, err := mg.lock(ctx)
	if err != nil {
		return 0, false, err
	}
	defer func() { err = errors.Join(err, unlock()) }()
	if was, wasDirty, err = mg.Version(); err != nil {
		return 0, false, err
	}
	if err := mg.m.Force(forceArg(v)); err != nil {
		return 0, false, fmt.Errorf("migrate force %d: %w", v, err)
	}
	return was, wasDirty, nil
}

// ErrUnknownVersion is wrapped by Force's error for a version no embedded
// migration has.
var ErrUnknownVersion = errors.New("unknown migration version")

// forceArg is golang-migrate's Force argument for version v (-1: none).
func forceArg(v uint) int {
	if v == 0 {
		return -1
	}
	return int(v)
}

// upMigration returns the text of migration v's up file.
func upMigration(v uint) (string, error) {
	files, err := fs.Glob(migrations.FS, fmt.Sprintf("%06d_*.up.sql", v))
	if err != nil || len(files) != 1 {
		return "", fmt.Errorf("migration %d: %w", v, fs.ErrNotExist)
	}
	b, err := fs.ReadFile(migrations.FS, files[0])
	return string(b), err
}

// previousMigration is the embedded migration before v (0: none).
func previousMigration(v uint) (uint, error) {
	vs, err := migrationVersions()
	if err != nil {
		return 0, err
	}
	var prev uint
	for _, n := range vs {
		if n < v {
			prev = max(prev, n)
		}
	}
	return prev, nil
}

// Transactional reports whether an up migration runs as one transaction.
// golang-migrate sends a migration file as one simple-protocol query, and
// PostgreSQL runs the statements of such a query in one implicit
// transaction: a process killed half-way leaves none of them applied. The
// exceptions are a file that ends or opens transactions itself (BEGIN,
// COMMIT, ROLLBACK, END, START TRANSACTION) and statements PostgreSQL
// runs outside a transaction (CONCURRENTLY, VACUUM, CREATE DATABASE,
// ALTER SYSTEM); such a file is not re-run by Up. Function bodies, quoted
// strings and comments are left out before looking, so a plpgsql
// BEGIN ... END counts for nothing. Unsure (an unterminated comment,
// string or body, which PostgreSQL refuses anyway) is false.
func Transactional(sql string) bool {
	s, ok := stripQuoted(sql)
	return ok && !nonTransactional.MatchString(strings.ToUpper(s))
}

var nonTransactional = regexp.MustCompile(`\b(BEGIN|COMMIT|ROLLBACK|START\s+TRANSACTION|SAVEPOINT|CONCURRENTLY|VACUUM|CREATE\s+DATABASE|DROP\s+DATABASE|ALTER\s+SYSTEM|CREATE\s+TABLESPACE)\b|\bEND\s*;`)

// stripQuoted removes comments, quoted strings and identifiers and
// dollar-quoted bodies from sql; ok is false when one is not terminated
// (what follows it cannot be read).
func stripQuoted(sql string) (_ string, ok bool) {
	var b strings.Builder
	for i := 0; i < len(sql); {
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			j := strings.IndexByte(sql[i:], '\n')
			if j < 0 {
				return b.String(), true // a comment ends at the end of the file
			}
			i += j
		case strings.HasPrefix(sql[i:], "/*"):
			j := strings.Index(sql[i+2:], "*/")
			if j < 0 {
				return "", false
			}
			i += 2 + j + 2
			b.WriteByte(' ')
		case sql[i] == '\'' || sql[i] == '"':
			j := strings.IndexByte(sql[i+1:], sql[i])
			if j < 0 {
				return "", false
			}
			i += 1 + j + 1 // a doubled quote reads as two strings side by side
			b.WriteByte(' ')
		case sql[i] == '$':
			tag := dollarTag.FindString(sql[i:])
			if tag == "" {
				b.WriteByte(sql[i])
				i++
				continue
			}
			j := strings.Index(sql[i+len(tag):], tag)
			if j < 0 {
				return "", false
			}
			i += len(tag) + j + len(tag)
			b.WriteByte(' ')
		default:
			b.WriteByte(sql[i])
			i++
		}
	}
	return b.String(), true
}

var dollarTag = regexp.MustCompile(`^\$[A-Za-z_]*\$`)

// latestMigration is the version of the last migration embedded.
func latestMigration() (uint, error) {
	vs, err := migrationVersions()
	if err != nil {
		return 0, err
	}
	var last uint
	for _, v := range vs {
		last = max(last, v)
	}
	return last, nil
}

// LatestMigration is the version of the last migration this release embeds.
func LatestMigration() (uint, error) { return latestMigration() }

// migrationVersions lists the embedded migrations' versions.
func migrationVersions() ([]uint, error) {
	ups, err := fs.Glob(migrations.FS, "*.up.sql")
	if err != nil {
		return nil, err
	}
	var vs []uint
	for _, f := range ups {
		n, err := strconv.ParseUint(f[:max(strings.IndexByte(f, '_'), 0)], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", f, err)
		}
		vs = append(vs, uint(n))
	}
	return vs, nil
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
