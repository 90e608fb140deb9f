#!/bin/sh
tar czf ~/backup.tgz ~/notes
