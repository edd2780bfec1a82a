// Package cli holds what muster's subcommands share, whichever package
// implements them (cmd/muster, internal/loadgen): their flag sets, the
// usage error, and the quiet logger of the tool commands.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
)

// ErrUsage marks a command line that could not be understood. The command
// has already said why on stderr; main exits 2 without printing it again.
var ErrUsage = errors.New("usage")

// NewFlags returns the flag set of `muster name`: it reports errors to
// stderr and Parse turns them into ErrUsage instead of exiting.
func NewFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("muster "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// Parse parses args into fs, which takes no positional arguments. Every
// error, -h included (the flag package has printed the defaults), is
// ErrUsage.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return ErrUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", fs.Name(), fs.Arg(0))
		return ErrUsage
	}
	return nil
}

// QuietLogger logs warnings and errors to w: a tool command's output is
// its result, not muster's start-up chatter.
func QuietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// DataFlag adds the --data flag of the commands that work on a database,
// to dir.
func DataFlag(fs *flag.FlagSet, dir *string) {
	fs.StringVar(dir, "data", ".muster", "dev data folder (used when DATABASE_URL is not set)")
}
