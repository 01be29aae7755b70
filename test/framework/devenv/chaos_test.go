package devenv

import (
	"strings"
	"testing"
	"time"
)

// The invariant of the randomized run: a write the writer acknowledged and the volume lost (or
// changed) fails the check, naming the record; writes not acknowledged yet do not count.
func TestVerifyAcks(t *testing.T) {
	const a, b, c = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
		"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
		"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"
	logs := "ACK 1 " + a + "\nACK 2 " + b + "\n"
	for _, tc := range []struct {
		name, sums string
		want       int
		wantErr    string
	}{
		{"all there", a + "  rec-1\n" + b + "  rec-2\n", 2, ""},
		{"one more, not acknowledged yet", a + "  rec-1\n" + b + "  rec-2\n" + c + "  rec-3\n", 2, ""},
		{"an acknowledged record missing", a + "  rec-1\n", 0, "rec-2 missing"},
		{"an acknowledged record changed", a + "  rec-1\n" + c + "  rec-2\n", 0, "rec-2 reads " + c},
		{"the volume empty", "", 0, "rec-1 missing; rec-2 missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := verifyAcks(logs, tc.sums)
			if tc.wantErr == "" {
				if err != nil || n != tc.want {
					t.Fatalf("verifyAcks = %d, %v; want %d, nil", n, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("verifyAcks = %d, %v; want an error with %q", n, err, tc.wantErr)
			}
		})
	}
	if n, err := verifyAcks("", ""); n != 0 || err != nil {
		t.Errorf("nothing acknowledged: %d, %v", n, err)
	}
}

func TestChaosOptionsFromEnv(t *testing.T) {
	t.Setenv(EnvChaosSeed, "37")
	t.Setenv(EnvChaosSteps, "")
	o, err := ChaosOptionsFromEnv(3)
	if err != nil || o.Seed != 37 || o.Steps != 3 {
		t.Errorf("seed 37, steps unset: %+v, %v", o, err)
	}
	t.Setenv(EnvChaosSteps, "60")
	if o, err := ChaosOptionsFromEnv(3); err != nil || o.Steps != 60 {
		t.Errorf("steps 60: %+v, %v", o, err)
	}
	t.Setenv(EnvChaosDuration, "30m")
	if o, err := ChaosOptionsFromEnv(3); err != nil || o.Duration != 30*time.Minute || !strings.Contains(o.String(), "faults for 30m0s") {
		t.Errorf("duration 30m: %+v (%s), %v", o, o, err)
	}
	begin := time.Now().Add(-31 * time.Minute)
	if o := (ChaosOptions{Duration: 30 * time.Minute}); !o.more(1, begin) || o.more(2, begin) || !o.more(2, time.Now()) {
		t.Errorf("a run of 30m: the first fault always, no second after 31m, a second after 0s")
	}
	if o := (ChaosOptions{Steps: 2}); !o.more(2, begin) || o.more(3, time.Now()) {
		t.Errorf("a run of 2 faults: a second, no third")
	}
	for name, v := range map[string][3]string{"seed not a number": {"x", "", ""}, "steps zero": {"1", "0", ""}, "steps not a number": {"1", "many", ""},
		"duration not a duration": {"1", "", "30"}, "duration negative": {"1", "", "-1m"}} {
		t.Setenv(EnvChaosSeed, v[0])
		t.Setenv(EnvChaosSteps, v[1])
		t.Setenv(EnvChaosDuration, v[2])
		if _, err := ChaosOptionsFromEnv(3); err == nil || !strings.Contains(err.Error(), "PLINTH_CHAOS_") {
			t.Errorf("%s: %v, want an error naming the variable", name, err)
		}
	}
}
