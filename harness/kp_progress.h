/* kp_progress.h: the line a long command prints as each of its items finishes (gate's and run's cases, bench's
 * cases): where it stands, what the item took and an estimate of what is left. One format for every command. */
#ifndef KP_PROGRESS_H
#define KP_PROGRESS_H

/* Item i (0-based) of n finished with `result` after item_s seconds, `elapsed` seconds after the command's start.
 * On stderr "[i+1/n] RESULT  1.23s  elapsed  4.5s  left ~ 6.7s  NAME"; with json, on stdout as a JSON line
 * {"event":"case","index":i+1,"of":n,"case":NAME,"result":RESULT,"seconds":..,"elapsed":..,"eta":..}, flushed. The
 * estimate is the mean time of the items so far times the items left (0 after the last). `name` needs no JSON
 * escaping (a canonical case name). */
void kp_progress(int json, int i, int n, const char *name, const char *result, double item_s, double elapsed);

#endif
