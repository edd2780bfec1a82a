package db_test

import (
	"testing"

	"github.com/musterhq/muster/db/dbtest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }
