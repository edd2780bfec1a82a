// Package migrations embeds the golang-migrate SQL files, the only source of
// muster's schema. sqlc reads the same folder to generate db/.
package migrations

import "embed"

// FS holds the numbered up and down migrations.
//
//go:embed *.sql
var FS embed.FS
