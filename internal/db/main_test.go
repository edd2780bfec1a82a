package db_test

import (
	"testing"

	"github.com/musterhq/muster/internal/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
